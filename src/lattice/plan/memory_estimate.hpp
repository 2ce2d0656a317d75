// Memory estimate per rank: parameters, gradients and optimizer state under DP/ZeRO-0..3
// (Rajbhandari et al., SC20: 2Ψ + 2Ψ + KΨ), activations per Korthikanti et al. (MLSys 2023, Table
// 2) under TP/SP/CP/EP and recomputation, times the microbatches a pipeline schedule keeps in
// flight on each stage.
#pragma once

#include <vector>

#include "lattice/plan/hardware.hpp"
#include "lattice/plan/layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

// Mixed-precision model-state bytes for `params` parameters sharded over `shard_ranks`
// data-parallel ranks at the given ZeRO stage (0: P+G+K per parameter; 1: P+G+K/N; 2: P+(G+K)/N; 3:
// (P+G+K)/N).
double model_state_bytes(double params, int zero_stage, int shard_ranks, int param_bytes = 2,
                         int grad_bytes = 2, int optimizer_bytes = 12);

// Activation bytes of one transformer layer for one microbatch on one rank (Korthikanti Table 2,
// generalised to GQA, gated MLPs, MoE top-k, models without dropout, and context parallelism),
// under layout.recompute. With full recomputation of every k-th block (recompute_interval k > 1)
// this is a recomputed layer's; estimate_memory mixes recomputed and kept layers per stage.
double activation_bytes_per_layer(const ModelSpec& model, const ParallelLayout& layout);

// Microbatches (in units of one chunk of layers) whose activations pipeline rank `stage` holds at
// peak: GPipe m, 1F1B and ZB-H1 min(p - stage, m), interleaved min(2(p - stage - 1) + (v - 1)p + 1,
// m v) chunks.
int peak_chunks_in_flight(const ParallelLayout& layout, int stage);

struct StageMemory {
  int stage = 0;
  double parameters = 0;  // parameters held on the rank (after TP/PP/EP sharding), count
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  double temporary_bytes = 0;  // ZeRO-3 gathered layers, logits of one microbatch
  double total() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + temporary_bytes;
  }
};

struct MemoryEstimate {
  std::vector<StageMemory> stages;  // one per pipeline rank
  const StageMemory& peak() const;  // the rank that needs the most
};

MemoryEstimate estimate_memory(const ModelSpec& model, const ParallelLayout& layout);

// Devices needed just to hold the bf16 weights, and the full mixed-precision model state (ZeRO-3
// sharded P+G+K bytes per parameter), on `hardware` (no activations; capacity = device memory).
struct MinimumDevices {
  double weight_bytes = 0;
  double model_state_bytes = 0;
  int for_weights = 0;
  int for_model_state = 0;
};
MinimumDevices minimum_devices(const ModelSpec& model, const HardwareSpec& hardware,
                               const ParallelLayout& precision = {});

}  // namespace lattice::plan
