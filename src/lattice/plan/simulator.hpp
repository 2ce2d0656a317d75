// Cluster simulator: replays one pipeline's schedule (the action lists of lattice::pipeline) with
// the cost model, adds data-parallel gradient reduction (with or without overlap), ZeRO-3 gathers
// and the optimizer step, and reports step time, TFLOP/s per device, MFU, bubble, exposed
// communication and memory per rank. Deterministic; all data-parallel replicas are identical, so
// one pipeline is replayed.
#pragma once

#include <string>
#include <vector>

#include "lattice/parallel/pipeline/replay.hpp"
#include "lattice/plan/cost_model.hpp"
#include "lattice/plan/hardware.hpp"
#include "lattice/plan/layout.hpp"
#include "lattice/plan/memory_estimate.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

struct SimulationResult {
  double step_seconds = 0;
  double pipeline_seconds = 0;    // replayed forward/backward of all microbatches
  double dp_exposed_seconds = 0;  // gradient reduction not hidden behind backward
  double optimizer_seconds = 0;
  double tp_comm_seconds = 0;          // per rank, summed over the step (exposed: not overlapped)
  double exposed_comm_seconds = 0;     // TP + CP/EP + exposed DP + ZeRO-3 gathers
  double bubble_fraction = 0;          // idle share of the pipeline replay
  double model_flops_per_step = 0;     // 3 x forward (Korthikanti eq. 7 for GPT)
  double hardware_flops_per_step = 0;  // with recomputation (Megatron eq. 3 with full recompute)
  double model_tflops_per_device = 0;
  double hardware_tflops_per_device = 0;
  double mfu = 0;
  double hfu = 0;
  double tokens_per_second = 0;
  MemoryEstimate memory;
  pipeline::Schedule schedule;    // the schedule replayed (one pipeline)
  pipeline::ReplayResult replay;  // its timed actions
};

SimulationResult simulate(const ModelSpec& model, const ParallelLayout& layout,
                          const HardwareSpec& hw, const CostParameters& cost = {});

}  // namespace lattice::plan
