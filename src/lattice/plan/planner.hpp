// Layout planner: for a model, a device type, a device count and a global batch, enumerates TP
// (within a node), PP (up to the layers; a layer count it does not divide splits unevenly), DP, CP,
// EP, ZeRO stage, microbatch size, recomputation and pipeline schedule; drops layouts that do not
// fit in memory; ranks the rest by simulated step time.
#pragma once

#include <string>
#include <vector>

#include "lattice/plan/cost_model.hpp"
#include "lattice/plan/hardware.hpp"
#include "lattice/plan/layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

struct PlanRequest {
  ModelSpec model;
  HardwareSpec hardware;
  int devices = 8;
  int global_batch_size = 8;
  int top = 5;                          // layouts to return
  double usable_memory_fraction = 0.9;  // of device memory (allocator fragmentation, workspaces)
  int max_micro_batch_size = 8;
  bool flash_attention =
      true;  // plan with fused causal attention (off: Megatron-style unfused kernels)
  CostParameters cost;
};

struct PlannedLayout {
  ParallelLayout layout;
  double step_seconds = 0;
  double mfu = 0;
  double model_tflops_per_device = 0;
  double tokens_per_second = 0;
  double bubble_fraction = 0;
  double exposed_comm_seconds = 0;
  double peak_memory_bytes = 0;
};

struct PlanResult {
  std::vector<PlannedLayout> best;  // fastest first
  int considered = 0;               // layouts enumerated
  int fitting = 0;                  // of which fit in memory and were simulated
  std::string rationale;            // one line: why the best beats the obvious alternatives
};

// Throws lattice::Error when no layout is valid or none fits (naming the smallest memory need
// found).
PlanResult plan_layouts(const PlanRequest& request);

}  // namespace lattice::plan
