// Cluster simulator (see simulator.hpp).
#include "lattice/plan/simulator.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"
#include "lattice/parallel/pipeline/stage_partition.hpp"
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
  // The mean layers per virtual stage (rank-level totals below), and each stage's own count:
  // layer counts the stages do not divide split as the trainer splits them (the remainder on the
  // middle stages).
  const double layers_per_stage = static_cast<double>(model.n_layers) / stages;
  const pipeline::StagePartition partition = pipeline::even_partition(model.n_layers, stages);
  const bool split = r.schedule.splits_weight_gradient;

  // Durations of F, B and W per virtual stage.
  std::vector<double> forward(stages), backward(stages), weight(stages);
  for (int stage = 0; stage < stages; ++stage) {
    const auto layers_here = static_cast<double>(partition.layers(stage));
    forward[stage] = layers_here * layer.forward();
    const double input_grad = layers_here * (layer.backward_input + layer.recompute);
    const double weight_grad = layers_here * layer.backward_weight;
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
  // ZeRO (Rajbhandari et al.): stage 0 all-reduces gradients once per step; stage 1 reduce-scatters
  // them and all-gathers updated parameters; stage 2 reduce-scatters every microbatch's gradients
  // as its backward finishes; stage 3 also gathers each layer's parameters before its forward and
  // backward, every microbatch (3 x Ψ per microbatch), prefetched behind the neighbouring layer's
  // compute.
  const double grad_bytes = stage_params * layout.grad_bytes;
  const double param_bytes = stage_params * layout.param_bytes;
  auto dp_collective = [&](Collective op, double bytes) {
    return collective_seconds(op, bytes, dp_group, dp_per_node, hw, cost);
  };
  // Backward of one microbatch through this rank's layers: the window that hides gradient
  // reduction.
  const double backward_window = (backward[0] + weight[0]) * r.schedule.chunks_per_rank;
  double step_end_comm = 0;  // after the pipeline: hidden behind the last backward if overlapped
  double per_microbatch_exposed = 0;
  if (dp_group > 1) {
    switch (layout.zero_stage) {
      case 0:
        step_end_comm = dp_collective(Collective::kAllReduce, grad_bytes);
        break;
      case 1:
        step_end_comm = dp_collective(Collective::kReduceScatter, grad_bytes) +
                        dp_collective(Collective::kAllGather, param_bytes);
        break;
      case 2:
        per_microbatch_exposed =
            std::max(0.0, dp_collective(Collective::kReduceScatter, grad_bytes) - backward_window);
        step_end_comm = dp_collective(Collective::kAllGather, param_bytes);
        break;
      case 3: {
        const double layers_on_rank = layers_per_stage * r.schedule.chunks_per_rank;
        const double layer_params_bytes = param_bytes / layers_on_rank;
        const double gather = dp_collective(Collective::kAllGather, layer_params_bytes);
        const double scatter =
            dp_collective(Collective::kReduceScatter,
                          layer_params_bytes / layout.param_bytes * layout.grad_bytes);
        per_microbatch_exposed =
            layers_on_rank * (std::max(0.0, gather - layer.forward()) +
                              std::max(0.0, gather + scatter - layer.backward()));
        break;
      }
      default:
        break;
    }
  }
  const double overlap_window = layout.overlap_grad_reduce ? backward_window : 0;
  r.dp_exposed_seconds = std::max(0.0, step_end_comm - overlap_window) + m * per_microbatch_exposed;
  const double shard = layout.zero_stage >= 1 ? dp_group : 1;
  r.optimizer_seconds = optimizer_seconds(stage_params / shard, layout, hw, cost);
  r.step_seconds = r.pipeline_seconds + r.dp_exposed_seconds + r.optimizer_seconds;

  const double chunks_per_rank = r.schedule.chunks_per_rank;
  r.tp_comm_seconds =
      m * chunks_per_rank * layers_per_stage * (layer.comm_forward + layer.comm_backward);
  r.exposed_comm_seconds = r.tp_comm_seconds + r.dp_exposed_seconds;
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
