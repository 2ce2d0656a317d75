// PipelinedStepRunner: the StepRunner of a pipeline-parallel rank — its virtual stages, their data
// parallelism and the executor (train/pipeline_rank.hpp), and the pipeline's training step
// (pipeline_step.hpp) as the step.
#pragma once

#include "lattice/train/pipeline_rank.hpp"
#include "lattice/train/step_runner.hpp"

namespace lattice::train {

class PipelinedStepRunner final : public StepRunner {
 public:
  // The pipeline rank must outlive this.
  PipelinedStepRunner(PipelineRank& pipeline, CommunicationClocks& clocks)
      : StepRunner(clocks), pipeline_(pipeline) {}

  double evaluate(const model::LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                  int64_t B, int64_t T) override {
    return pipeline_.evaluate(ctx, tokens, targets, B, T);
  }
  int stage_count() const override { return pipeline_.stage_count(); }
  model::Transformer& stage(int i) override { return pipeline_.model(i); }
  parallel::DataParallel& data_parallel(int i) override { return pipeline_.data_parallel(i); }
  void settle_parameters() override { pipeline_.settle_parameters(); }
  const pipeline::StepTimeline* timeline() const override {
    return &pipeline_.executor().timeline();
  }

 protected:
  StepOutcome train_step(const model::LayerContext& ctx, const StepShape& shape,
                         const MicroBatchSource& next_micro_batch, float lr,
                         int64_t step) override {
    return pipeline_.step(ctx, shape, next_micro_batch, lr, step);
  }

 private:
  PipelineRank& pipeline_;
};

}  // namespace lattice::train
