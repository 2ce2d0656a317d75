// Static checker of pipeline schedules: proves a schedule complete (every stage forwards and
// backwards every microbatch exactly once on its owner, W exactly once when split, sends matched by
// receives with the right peers) and free of deadlock (a replay reaches the end) before anything
// runs.
#pragma once

#include <string>

#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::pipeline {

struct CheckReport {
  bool ok = true;
  std::string problem;  // first problem found, one line
};

CheckReport check_schedule(const Schedule& schedule);
// Throws lattice::Error with the report's problem when the schedule is not valid.
void require_valid_schedule(const Schedule& schedule);

}  // namespace lattice::pipeline
