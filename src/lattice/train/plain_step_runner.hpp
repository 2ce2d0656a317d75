// PlainStepRunner: the StepRunner of a rank without pipeline parallelism — one model holding every
// block, its data parallelism, and training_step (training_step.hpp) as the step.
#pragma once

#include "lattice/train/step_runner.hpp"

namespace lattice::train {

class PlainStepRunner final : public StepRunner {
 public:
  // The model and its data parallelism must outlive this.
  PlainStepRunner(model::Transformer& model, parallel::DataParallel& data_parallel,
                  CommunicationClocks& clocks)
      : StepRunner(clocks), model_(model), dp_(data_parallel) {}

  double evaluate(const model::LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                  int64_t B, int64_t T) override {
    return model_.evaluate(ctx, tokens, targets, B, T);
  }
  int stage_count() const override { return 1; }
  model::Transformer& stage(int) override { return model_; }
  parallel::DataParallel& data_parallel(int) override { return dp_; }
  void settle_parameters() override { dp_.settle_parameters(); }
  const pipeline::StepTimeline* timeline() const override { return nullptr; }

 protected:
  StepOutcome train_step(const model::LayerContext& ctx, const StepShape& shape,
                         const MicroBatchSource& next_micro_batch, float lr,
                         int64_t step) override {
    return training_step(model_, dp_, ctx, shape, next_micro_batch, lr, step);
  }

 private:
  model::Transformer& model_;
  parallel::DataParallel& dp_;
};

}  // namespace lattice::train
