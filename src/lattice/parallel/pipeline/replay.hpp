// Timed replay of a pipeline schedule: runs every rank's action list in order against a cost model
// (compute durations, transfer times), honouring data dependencies. Sends are non-blocking (the
// data arrives at the peer after the transfer time); receives and compute wait for their inputs.
// Used by the checker (unit costs) and by the cluster simulator (costs from the hardware model).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::pipeline {

struct ReplayCosts {
  // Seconds (or any unit) that a compute action (F, B, W) keeps its rank busy.
  std::function<double(int rank, const Action& action)> compute;
  // Time from a send being issued to its data being available at the peer; null means 0.
  std::function<double(int from_rank, int to_rank, const Action& send)> transfer;
};

struct TimedAction {
  Action action;
  double start = 0;  // for a receive: when the rank started waiting
  double end = 0;    // for a receive: when the data arrived; for a send: when it was issued
};

struct ReplayResult {
  bool completed = false;
  std::string stall;  // when not completed: which ranks are stuck on which action
  double makespan = 0;
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in list order
  std::vector<double> busy;                        // per rank: total compute time
  std::vector<double> finish;                      // per rank: end of its last action
  std::vector<int>
      peak_in_flight;  // per rank: most (stage, microbatch) pairs forwarded, not backwarded

  // Idle share of the step: 1 - (mean busy time / makespan).
  double bubble_fraction() const;
};

// Replays the schedule. Never throws for a deadlock: the result says completed = false and where it
// stalled.
ReplayResult replay(const Schedule& schedule, const ReplayCosts& costs);

// Costs that make F, B and W take `forward`, `backward`, `weight` time units and transfers free.
ReplayCosts uniform_costs(double forward, double backward, double weight = 0);

}  // namespace lattice::pipeline
