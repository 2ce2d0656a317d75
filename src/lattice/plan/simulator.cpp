// Cluster simulator (see simulator.hpp).
#include "lattice/plan/simulator.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"
#include "lattice/plan/compute_estimate.hpp"

namespace lattice::plan {

SimulationResult simulate(const ModelSpec& model, const ParallelLayout& layout,
                          const HardwareSpec& hw, const CostParameters& cost) {
  validate_layout(model, layout, hw.devices_per_node);
  SimulationResult r;
  const int p = layout.pp;
  const int m = layout.num_microbatches();
  check(m >= 1, "global batch " + std::to_string(layout.global_batch_size) +
                    " gives no microbatch per pipeline: raise global_batch_size");
  r.schedule = p > 1 ? pipeline::make_schedule(layout.schedule, p, m, layout.virtual_stages)
                     : pipeline::make_one_f_one_b(1, m);
  const LayerCosts layer = layer_costs(model, layout, hw, cost);
  const EdgeCosts edge = edge_costs(model, layout, hw, cost);
  const double transfer = pipeline_transfer_seconds(model, layout, hw, cost);
  const int stages = r.schedule.num_stages();
  const double layers_per_stage = static_cast<double>(model.layers) / stages;
  const bool split = r.schedule.splits_weight_gradient;

  // Durations of F, B and W per virtual stage.
  std::vector<double> forward(stages), backward(stages), weight(stages);
  for (int stage = 0; stage < stages; ++stage) {
    forward[stage] = layers_per_stage * layer.forward();
    const double input_grad = layers_per_stage * (layer.backward_input + layer.recompute);
    const double weight_grad = layers_per_stage * layer.backward_weight;
    if (stage == 0) {
      forward[stage] += edge.embedding_forward;
      backward[stage] += edge.embedding_backward;
    }
    if (stage == stages - 1) {
      forward[stage] += edge.head_forward;
      backward[stage] += edge.head_backward;
    }
    backward[stage] += split ? input_grad : input_grad + weight_grad;
    weight[stage] = split ? weight_grad : 0;
  }
  pipeline::ReplayCosts costs;
  costs.compute = [&](int, const pipeline::Action& a) {
    switch (a.kind) {
      case pipeline::ActionKind::kForward:
        return forward[a.stage];
      case pipeline::ActionKind::kBackward:
        return backward[a.stage];
      case pipeline::ActionKind::kBackwardWeight:
        return weight[a.stage];
      default:
        return 0.0;
    }
  };
  costs.transfer = [&](int, int, const pipeline::Action&) { return transfer; };
  r.replay = pipeline::replay(r.schedule, costs);
  check(r.replay.completed, "pipeline schedule deadlocked in the simulator: " + r.replay.stall);
  r.pipeline_seconds = r.replay.makespan;
  r.bubble_fraction = r.replay.bubble_fraction();

  // Data-parallel gradient reduction and ZeRO traffic for the busiest stage.
  r.memory = estimate_memory(model, layout);
  double stage_params = 0;
  for (const auto& stage : r.memory.stages) stage_params = std::max(stage_params, stage.parameters);
  const int dp_group = layout.dp * layout.cp;
  const int dp_stride = layout.tp * layout.cp;
  const int dp_per_node = std::clamp(hw.devices_per_node / std::max(dp_stride, 1), 1, dp_group);
  double dp_seconds = 0;
  double zero3_exposed = 0;
  const double grad_bytes = stage_params * layout.grad_bytes;
  if (dp_group > 1) {
    if (layout.zero_stage == 0) {
      dp_seconds =
          collective_seconds(Collective::kAllReduce, grad_bytes, dp_group, dp_per_node, hw, cost);
    } else {
      dp_seconds = collective_seconds(Collective::kReduceScatter, grad_bytes, dp_group, dp_per_node,
                                      hw, cost) +
                   collective_seconds(Collective::kAllGather, stage_params * layout.param_bytes,
                                      dp_group, dp_per_node, hw, cost);
    }
    if (layout.zero_stage == 3) {
      // Parameters are gathered before each layer's forward and backward of every microbatch; the
      // gathers are prefetched behind compute, the excess is exposed.
      const double layer_params = stage_params / layers_per_stage / r.schedule.chunks_per_rank;
      const double gather =
          collective_seconds(Collective::kAllGather, layer_params * layout.param_bytes, dp_group,
                             dp_per_node, hw, cost);
      const double per_layer_exposed =
          std::max(0.0, gather - layer.forward()) + std::max(0.0, gather - layer.backward());
      zero3_exposed = per_layer_exposed * layers_per_stage * stages / p * m;
      dp_seconds -= collective_seconds(Collective::kAllGather, stage_params * layout.param_bytes,
                                       dp_group, dp_per_node, hw, cost);  // no final gather
    }
  }
  // With overlap, the reduction of the last microbatch's gradients hides behind its backward pass.
  const double overlap_window =
      layout.overlap_grad_reduce ? backward[0] * r.schedule.chunks_per_rank : 0;
  r.dp_exposed_seconds = std::max(0.0, dp_seconds - overlap_window) + zero3_exposed;
  const double shard = layout.zero_stage >= 1 ? dp_group : 1;
  r.optimizer_seconds = optimizer_seconds(stage_params / shard, layout, hw, cost);
  r.step_seconds = r.pipeline_seconds + r.dp_exposed_seconds + r.optimizer_seconds;

  const double chunks_per_rank = r.schedule.chunks_per_rank;
  r.tp_comm_seconds =
      m * chunks_per_rank * layers_per_stage * (layer.comm_forward + layer.comm_backward);
  r.exposed_comm_seconds = r.tp_comm_seconds + r.dp_exposed_seconds;
  // Waiting of the first rank beyond what equal stages would cost: pipeline transfers on the
  // critical path.
  r.p2p_wait_seconds =
      p > 1 ? std::max(0.0, r.replay.makespan - r.replay.busy[0] -
                                (p - 1) * (forward[0] + backward[0] + weight[0]) / chunks_per_rank)
            : 0;

  const double batch = layout.global_batch_size;
  r.model_flops_per_step = model_flops_per_sequence(model) * batch;
  r.hardware_flops_per_step = hardware_flops_per_sequence(model, layout.recompute) * batch;
  const double devices = layout.world_size();
  r.model_tflops_per_device = r.model_flops_per_step / (devices * r.step_seconds) / 1e12;
  r.hardware_tflops_per_device = r.hardware_flops_per_step / (devices * r.step_seconds) / 1e12;
  r.mfu = r.model_tflops_per_device * 1e12 / hw.peak_bf16_flops;
  r.hfu = r.hardware_tflops_per_device * 1e12 / hw.peak_bf16_flops;
  r.tokens_per_second = batch * model.seq_len / r.step_seconds;
  return r;
}

}  // namespace lattice::plan
