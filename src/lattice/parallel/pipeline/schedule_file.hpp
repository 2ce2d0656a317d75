// Pipeline schedules from files: per-rank action lists in JSON or CSV, checked (checker.hpp)
// before any work, so that a deadlocking or incomplete list is refused with one line naming the
// ranks and actions. Also the writer, so that a generated schedule can be edited by hand.
//
// JSON: {"num_ranks": 2, "num_microbatches": 4, "chunks_per_rank": 1, "stage_owner": [0, 1],
//        "actions": [[{"op": "F", "stage": 0, "mb": 0}, {"op": "SEND_F", "stage": 0, "mb": 0,
//        "peer": 1}, ...], [...]]}   (one list per rank; "kind" optional, informational)
// CSV:  a header line "rank,op,stage,microbatch,peer", then one action per line in each rank's
//       order (peer empty for compute); the stages' owners are the ranks that forward them.
// Ops: F, B, W, SEND_F, RECV_F, SEND_B, RECV_B (action_kind_name).
#pragma once

#include <string>

#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::pipeline {

// Reads `path` (".json" or ".csv"), checks the schedule, and returns it; throws lattice::Error
// with one line naming the file and the problem.
Schedule load_schedule(const std::string& path);
// The schedule as JSON text (load_schedule reads it back).
std::string schedule_json(const Schedule& schedule);

}  // namespace lattice::pipeline
