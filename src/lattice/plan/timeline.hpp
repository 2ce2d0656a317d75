// Drawing a replayed pipeline: Chrome-trace JSON (one pid per pipeline rank, compute and transfers
// on separate threads; open in chrome://tracing or Perfetto) and an ASCII timeline for small
// pipelines.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lattice/parallel/pipeline/replay.hpp"
#include "lattice/plan/simulator.hpp"

namespace lattice::plan {

// Trace of one pipeline of the simulated step: per rank its F/B/W, receive waits, then the exposed
// data-parallel reduction and the optimizer step. Times in microseconds.
nlohmann::json chrome_trace(const SimulationResult& result, const ParallelLayout& layout);
void write_chrome_trace(const std::string& path, const SimulationResult& result,
                        const ParallelLayout& layout);

// One line per rank, `width` columns spanning the makespan: F of microbatch k as the k-th capital
// letter (cycling), its B as the same letter in lower case, W as '*', idle as '.'. A legend line
// follows.
std::string ascii_timeline(const pipeline::ReplayResult& replay, int width = 96);

}  // namespace lattice::plan
