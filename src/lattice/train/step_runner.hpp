// StepRunner: what the trainer's loop runs its steps through, the same for a plain and a pipelined
// rank — one training step with the communication time of every family, the mean loss of a batch,
// this rank's stages (each a model::Transformer with its parallel::DataParallel; one without a
// pipeline) for the MoE upkeep, checkpoints and validation, settling ZeRO's gathers, and the
// pipeline's action timeline for the trace. PlainStepRunner (plain_step_runner.hpp) wraps
// training_step, PipelinedStepRunner (pipelined_step_runner.hpp) the pipeline rank's step.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/moe_statistics.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/parallel/pipeline/executor.hpp"
#include "lattice/train/communication_times.hpp"
#include "lattice/train/training_step.hpp"

namespace lattice::train {

class StepRunner {
 public:
  // `clocks`: where the model's tp and ep groups add their time (they must outlive this).
  explicit StepRunner(CommunicationClocks& clocks) : clocks_(clocks) {}
  virtual ~StepRunner() = default;
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Runs step `step` (1-based) at learning rate lr; the outcome's communication has every family
  // of the step's (and no validation's or checkpoint's). Collective over every group the step
  // uses. Throws lattice::Error, before the update, when the loss is not finite.
  StepOutcome run(const model::LayerContext& ctx, const StepShape& shape,
                  const MicroBatchSource& next_micro_batch, float lr, int64_t step);
  // The mean loss of one [B, T] batch through every stage, on every rank. Collective.
  virtual double evaluate(const model::LayerContext& ctx, const int32_t* tokens,
                          const int32_t* targets, int64_t B, int64_t T) = 0;

  // This rank's stages, in virtual-stage order.
  virtual int stage_count() const = 0;
  virtual model::Transformer& stage(int i) = 0;
  virtual parallel::DataParallel& data_parallel(int i) = 0;
  // Completes pending ZeRO gathers on every stage.
  virtual void settle_parameters() = 0;
  // The last step's pipeline actions, for the trace (null without a pipeline).
  virtual const pipeline::StepTimeline* timeline() const = 0;
  // Every stage's MoE routing statistics since the last take (Transformer::take_moe_statistics).
  std::vector<model::MoeLayerStatistics> take_moe_statistics();

 protected:
  // The step itself: its outcome with data parallelism's and the pipeline's communication.
  virtual StepOutcome train_step(const model::LayerContext& ctx, const StepShape& shape,
                                 const MicroBatchSource& next_micro_batch, float lr,
                                 int64_t step) = 0;

 private:
  CommunicationClocks& clocks_;
};

}  // namespace lattice::train
