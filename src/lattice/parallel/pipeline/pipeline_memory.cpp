// Pipeline activation memory: see pipeline_memory.hpp.
#include "lattice/parallel/pipeline/pipeline_memory.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "lattice/core/error.hpp"

namespace lattice::pipeline {

PipelineActivationMemory estimate_pipeline_activations(
    const Schedule& schedule, int rank, const std::vector<const model::Transformer*>& stages,
    kernels::Precision precision, int64_t B, int64_t T, const kernels::Ops& ops) {
  PipelineActivationMemory memory;
  const int last = schedule.num_stages() - 1;
  // Per virtual stage of this rank: one set's bytes, and what a set awaiting its W adds.
  std::map<int, std::pair<int64_t, int64_t>> bytes;
  size_t next = 0;
  for (int s = 0; s <= last; ++s) {
    if (schedule.stage_owner[static_cast<size_t>(s)] != rank) continue;
    check(next < stages.size(),
          "estimate_pipeline_activations: fewer models than the stages of "
          "rank " +
              std::to_string(rank) + " (internal error)");
    const model::Transformer& stage = *stages[next++];
    const model::ActivationMemory a =
        model::estimate_activation_memory(stage, precision, B, T, ops);
    // A transfer from or to another rank lands in a buffer of the set: one [rows, d_model] fp32.
    const int64_t rows = stage.tensor_parallel().local_rows(B * T) * stage.config().d_model * 4;
    int64_t received = 0;
    if (s > 0 && schedule.stage_owner[static_cast<size_t>(s - 1)] != rank) received += rows;
    if (s < last && schedule.stage_owner[static_cast<size_t>(s + 1)] != rank) received += rows;
    int64_t pending = rows;  // the stage's input gradient, kept until the set is freed
    for (int64_t i = 0; i < stage.block_count(); ++i)
      pending += stage.block(i).pending_weight_bytes(precision, B, T);
    if (!schedule.splits_weight_gradient) pending = 0;
    bytes[s] = {a.residuals + a.blocks + a.head + received, pending};
    memory.per_microbatch = std::max(memory.per_microbatch, bytes[s].first);
    memory.per_pending = std::max(memory.per_pending, pending);
    memory.running = std::max(memory.running, a.transient + a.backward);
  }
  // Walk the rank's actions: a set lives from its F to its B (or, when split, its W).
  int held = 0, awaiting = 0;
  int64_t now = 0;
  for (const Action& action : schedule.actions.at(static_cast<size_t>(rank))) {
    const auto [set, pending] = bytes.at(action.stage);
    if (action.kind == ActionKind::kForward) {
      ++held;
      now += set;
    } else if (action.kind == ActionKind::kBackward && schedule.splits_weight_gradient) {
      ++awaiting;
      now += pending;
    } else if (action.kind == ActionKind::kBackward) {
      --held;
      now -= set;
    } else if (action.kind == ActionKind::kBackwardWeight) {
      --awaiting;
      --held;
      now -= set + pending;
    } else {
      continue;
    }
    if (now > memory.held_bytes || (now == memory.held_bytes && held > memory.in_flight)) {
      memory.held_bytes = now;
      memory.in_flight = held;
      memory.awaiting_weight = awaiting;
    }
  }
  return memory;
}

}  // namespace lattice::pipeline
