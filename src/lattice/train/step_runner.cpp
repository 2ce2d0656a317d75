// The step runner's shared part: see step_runner.hpp.
#include "lattice/train/step_runner.hpp"

namespace lattice::train {

StepOutcome StepRunner::run(const model::LayerContext& ctx, const StepShape& shape,
                            const MicroBatchSource& next_micro_batch, float lr, int64_t step) {
  clocks_.start_step();
  StepOutcome outcome = train_step(ctx, shape, next_micro_batch, lr, step);
  clocks_.finish_step(outcome.communication);
  return outcome;
}

std::vector<model::MoeLayerStatistics> StepRunner::take_moe_statistics() {
  std::vector<model::MoeLayerStatistics> all;
  for (int i = 0; i < stage_count(); ++i)
    for (model::MoeLayerStatistics& s : stage(i).take_moe_statistics()) all.push_back(s);
  return all;
}

}  // namespace lattice::train
