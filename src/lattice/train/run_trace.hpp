// RunTrace: a Chrome trace (the JSON Trace Event format that Perfetto and chrome://tracing read)
// of chosen steps of a real run, in any layout: one process per world rank, and on its tracks the
// steps, a pipeline's compute actions (F, B, W, named with stage and microbatch) and its
// point-to-point transfers, and one track per communication group of the rank (dp x cp, the ZeRO
// shard group, HSDP's replicas, tp, cp, ep, the expert-data-parallel group, pp) holding each
// collective the rank entered during the step, named with its operation and size ("allreduce
// 4.0 KiB"; the whole record in its args), from the communicators' own records (comm/trace.hpp).
// `metrics.trace = "<path>"` and `metrics.trace_steps = "a:b"`; world rank 0 writes the file at the
// end of the run (staged and renamed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/parallel/pipeline/executor.hpp"

namespace lattice::train {

class RunTrace {
 public:
  struct Group {
    std::string name;  // the track's name, e.g. "tp"
    comm::Communicator* communicator = nullptr;
  };
  // `label`: this rank's process name in the trace (e.g. "rank 3 (pp 1, dp 0, tp 1)"); `groups`:
  // the communicators whose collectives get a track each.
  RunTrace(int world_rank, std::string label, std::vector<Group> groups);
  // Adds step `step`, which ran over [start_ns, end_ns) of the steady clock: its span, the
  // pipeline's actions when `timeline` is not null, and the collectives each group entered in the
  // span (those still running when they complete, at a later call). A communicator keeps its last
  // 64 records: where more ran between two calls, an instant event says how many are missing.
  void add_step(int64_t step, int64_t start_ns, int64_t end_ns,
                const pipeline::StepTimeline* timeline);
  // A step outside the traced ones: its collectives are passed over (the traced steps' that have
  // completed since are added).
  void skip_step() { add_collectives(); }
  // Gathers every rank's events to world rank 0, which writes `path`. Collective over `world`.
  void write(const std::string& path, comm::Communicator& world);

 private:
  struct Span {
    int64_t step = 0, start_ns = 0, end_ns = 0;
  };
  // The completed collectives not yet looked at, each added when it was entered in a traced step.
  void add_collectives();
  void add(const std::string& event);
  int track(const std::string& name);  // the track's id (named on first use)

  int world_rank_;
  std::vector<Group> groups_;
  std::vector<uint64_t> last_seq_;  // per group: the newest record already looked at
  std::vector<Span> spans_;         // the traced steps
  std::vector<std::string> tracks_;
  std::string events_;  // comma-separated JSON objects
};

// The monotonic steady clock in nanoseconds: the time line of step spans, pipeline timelines and
// collective records.
int64_t steady_clock_ns();

}  // namespace lattice::train
