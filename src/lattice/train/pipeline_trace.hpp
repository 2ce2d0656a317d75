// PipelineTrace: a Chrome trace (the JSON Trace Event format Perfetto and chrome://tracing read) of
// a pipeline run's real steps, from each rank's executor timelines: one process per world rank,
// its compute (F, B, W) and its communication (sends posted, receives waited for) on separate
// tracks, each action named with its stage and microbatch. `metrics.trace = "<path>"` turns it on;
// world rank 0 writes the file at the end of the run (crash-safe: staged and renamed).
#pragma once

#include <cstdint>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/parallel/pipeline/executor.hpp"

namespace lattice::train {

class PipelineTrace {
 public:
  // `label`: this rank's process name in the trace (e.g. "rank 3 (pp 1, dp 0, tp 1)").
  PipelineTrace(int world_rank, std::string label);
  // Appends one step's actions (at most `max_steps` steps are kept).
  void add_step(const pipeline::StepTimeline& timeline, int64_t step);
  // Gathers every rank's events to world rank 0, which writes `path`. Collective over `world`.
  void write(const std::string& path, comm::Communicator& world) const;

  static constexpr int64_t max_steps = 50;

 private:
  int world_rank_;
  std::string events_;  // comma-separated JSON objects
  int64_t steps_ = 0;
};

}  // namespace lattice::train
