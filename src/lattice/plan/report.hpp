// Output of the planning tools: human-readable tables and JSON for memory and compute estimates,
// simulations and plans. The CLI verbs print these; scripts read the JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lattice/plan/compute_estimate.hpp"
#include "lattice/plan/hardware.hpp"
#include "lattice/plan/memory_estimate.hpp"
#include "lattice/plan/planner.hpp"
#include "lattice/plan/simulator.hpp"

namespace lattice::plan {

// Device counts (powers of two up to 65536) on which the model fits with ZeRO-3 data parallelism,
// full recomputation and microbatch 1: the smallest such count, 0 when none.
int smallest_zero3_device_count(const ModelSpec& model, const HardwareSpec& hw,
                                double usable_fraction);

nlohmann::json memory_json(const ModelSpec& model, const ParallelLayout& layout,
                           const MemoryEstimate& memory, const HardwareSpec& hw);
std::string memory_text(const ModelSpec& model, const ParallelLayout& layout,
                        const MemoryEstimate& memory, const HardwareSpec& hw);

struct ComputeReport {
  ComputeEstimate estimate;
  double flops_per_device = 0;  // model FLOP/s per device used for the time
  double megatron_eq4_seconds = 0;
  int devices = 0;
  std::string throughput_source;  // "MFU 45% of 312 TFLOP/s", "simulated", ...
};
nlohmann::json compute_json(const ModelSpec& model, const ComputeReport& report);
std::string compute_text(const ModelSpec& model, const ComputeReport& report);

nlohmann::json simulation_json(const ModelSpec& model, const ParallelLayout& layout,
                               const HardwareSpec& hw, const SimulationResult& result);
std::string simulation_text(const ModelSpec& model, const ParallelLayout& layout,
                            const HardwareSpec& hw, const SimulationResult& result);

nlohmann::json plan_json(const PlanRequest& request, const PlanResult& result);
std::string plan_text(const PlanRequest& request, const PlanResult& result);

}  // namespace lattice::plan
