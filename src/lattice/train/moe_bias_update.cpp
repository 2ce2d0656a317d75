// The MoE choice-bias update: see moe_bias_update.hpp.
#include "lattice/train/moe_bias_update.hpp"

namespace lattice::train {

void update_moe_bias(StepRunner& runner, const MoeStepMetrics& moe, double rate) {
  if (rate <= 0) return;
  runner.settle_parameters();
  for (const MoeLayerMetrics& layer : moe.layers)
    for (int i = 0; i < runner.stage_count(); ++i)
      runner.stage(i).update_choice_bias(layer.layer, layer.tokens_per_expert, rate);
}

}  // namespace lattice::train
