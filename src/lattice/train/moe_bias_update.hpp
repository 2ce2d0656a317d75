// Auxiliary-loss-free balancing after a step (DeepSeek-V3; docs/moe.md): every rank moves its copy
// of each MoE layer's choice bias towards balance, from the layer's load over the step.
#pragma once

#include "lattice/train/moe_metrics.hpp"
#include "lattice/train/step_runner.hpp"

namespace lattice::train {

// Moves each MoE layer's choice bias on every stage of `runner` by `rate` (model
// moe_bias_update_rate; nothing when it is not positive) given the step's tokens per expert in
// `moe` (reduce_moe_metrics: the same on every rank, so the copies stay equal), once ZeRO-1/2's
// gathers of the updated shards (still in flight) have landed.
void update_moe_bias(StepRunner& runner, const MoeStepMetrics& moe, double rate);

}  // namespace lattice::train
