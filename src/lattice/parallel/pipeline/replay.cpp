// Timed replay of pipeline action lists (see replay.hpp).
#include "lattice/parallel/pipeline/replay.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace lattice::pipeline {
namespace {

constexpr double kUnknown = -1.0;

// Event times per (stage, microbatch), stored flat.
struct EventTable {
  int microbatches = 0;
  std::vector<double> times;
  EventTable(int stages, int mbs)
      : microbatches(mbs), times(static_cast<size_t>(stages) * mbs, kUnknown) {}
  double& at(int stage, int mb) { return times[static_cast<size_t>(stage) * microbatches + mb]; }
  bool valid(int stages, int stage, int mb) const {
    return stage >= 0 && stage < stages && mb >= 0 && mb < microbatches;
  }
};

}  // namespace

double ReplayResult::bubble_fraction() const {
  if (makespan <= 0 || busy.empty()) return 0;
  const double mean_busy = std::accumulate(busy.begin(), busy.end(), 0.0) / busy.size();
  return 1.0 - mean_busy / makespan;
}

ReplayCosts uniform_costs(double forward, double backward, double weight) {
  ReplayCosts costs;
  costs.compute = [=](int, const Action& action) {
    switch (action.kind) {
      case ActionKind::kForward:
        return forward;
      case ActionKind::kBackward:
        return backward;
      case ActionKind::kBackwardWeight:
        return weight;
      default:
        return 0.0;
    }
  };
  return costs;
}

ReplayResult replay(const Schedule& schedule, const ReplayCosts& costs) {
  const int ranks = schedule.num_ranks;
  const int stages = schedule.num_stages();
  const int mbs = schedule.num_microbatches;
  EventTable forward_end(stages, mbs), backward_end(stages, mbs);
  EventTable forward_arrival(stages, mbs), backward_arrival(stages, mbs);  // data at the receiver
  EventTable forward_received(stages, mbs), backward_received(stages, mbs);

  ReplayResult result;
  result.timeline.assign(ranks, {});
  result.busy.assign(ranks, 0.0);
  result.finish.assign(ranks, 0.0);
  result.peak_in_flight.assign(ranks, 0);
  std::vector<size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  std::vector<int> in_flight(ranks, 0);
  for (int rank = 0; rank < ranks; ++rank)
    result.timeline[rank].reserve(schedule.actions[rank].size());

  // Returns the time the action's inputs are ready, or kUnknown when they are not (yet).
  auto ready_time = [&](int rank, const Action& a) -> double {
    if (!forward_end.valid(stages, a.stage, a.microbatch)) return kUnknown;
    const bool local_prev = a.stage > 0 && schedule.stage_owner[a.stage - 1] == rank;
    const bool local_next = a.stage < stages - 1 && schedule.stage_owner[a.stage + 1] == rank;
    switch (a.kind) {
      case ActionKind::kForward:
        if (a.stage == 0) return 0.0;
        return local_prev ? forward_end.at(a.stage - 1, a.microbatch)
                          : forward_received.at(a.stage, a.microbatch);
      case ActionKind::kBackward: {
        const double own = forward_end.at(a.stage, a.microbatch);
        if (own == kUnknown) return kUnknown;
        if (a.stage == stages - 1) return own;
        const double grad = local_next ? backward_end.at(a.stage + 1, a.microbatch)
                                       : backward_received.at(a.stage, a.microbatch);
        return grad == kUnknown ? kUnknown : std::max(own, grad);
      }
      case ActionKind::kBackwardWeight:
        return backward_end.at(a.stage, a.microbatch);
      case ActionKind::kSendForward:
        return forward_end.at(a.stage, a.microbatch);
      case ActionKind::kSendBackward:
        return backward_end.at(a.stage, a.microbatch);
      case ActionKind::kRecvForward:
        return a.stage > 0 ? forward_arrival.at(a.stage - 1, a.microbatch) : kUnknown;
      case ActionKind::kRecvBackward:
        return a.stage < stages - 1 ? backward_arrival.at(a.stage + 1, a.microbatch) : kUnknown;
    }
    return kUnknown;
  };

  bool progress = true;
  size_t done = 0;
  size_t total = 0;
  for (const auto& list : schedule.actions) total += list.size();
  while (progress && done < total) {
    progress = false;
    for (int rank = 0; rank < ranks; ++rank) {
      const auto& list = schedule.actions[rank];
      while (next[rank] < list.size()) {
        const Action& a = list[next[rank]];
        const double ready = ready_time(rank, a);
        if (ready == kUnknown) break;
        TimedAction timed{a, clock[rank], clock[rank]};
        switch (a.kind) {
          case ActionKind::kForward:
          case ActionKind::kBackward:
          case ActionKind::kBackwardWeight: {
            const double duration = costs.compute ? costs.compute(rank, a) : 0.0;
            timed.start = std::max(clock[rank], ready);
            timed.end = timed.start + duration;
            clock[rank] = timed.end;
            result.busy[rank] += duration;
            if (a.kind == ActionKind::kForward) {
              forward_end.at(a.stage, a.microbatch) = timed.end;
              result.peak_in_flight[rank] =
                  std::max(result.peak_in_flight[rank], ++in_flight[rank]);
            } else if (a.kind == ActionKind::kBackward) {
              backward_end.at(a.stage, a.microbatch) = timed.end;
              --in_flight[rank];
            }
            break;
          }
          case ActionKind::kSendForward:
          case ActionKind::kSendBackward: {
            timed.start = timed.end = std::max(clock[rank], ready);
            const double transfer = costs.transfer ? costs.transfer(rank, a.peer, a) : 0.0;
            auto& arrival = a.kind == ActionKind::kSendForward ? forward_arrival : backward_arrival;
            arrival.at(a.stage, a.microbatch) = timed.end + transfer;
            break;
          }
          case ActionKind::kRecvForward:
          case ActionKind::kRecvBackward: {
            timed.start = clock[rank];
            timed.end = std::max(clock[rank], ready);
            clock[rank] = timed.end;
            auto& received =
                a.kind == ActionKind::kRecvForward ? forward_received : backward_received;
            received.at(a.stage, a.microbatch) = timed.end;
            break;
          }
        }
        result.timeline[rank].push_back(timed);
        ++next[rank];
        ++done;
        progress = true;
      }
    }
  }
  result.completed = done == total;
  if (!result.completed) {
    for (int rank = 0; rank < ranks; ++rank) {
      if (next[rank] >= schedule.actions[rank].size()) continue;
      if (!result.stall.empty()) result.stall += "; ";
      result.stall += "rank " + std::to_string(rank) + " waits at " +
                      describe(schedule.actions[rank][next[rank]]);
    }
  }
  for (int rank = 0; rank < ranks; ++rank) {
    result.finish[rank] = clock[rank];
    result.makespan = std::max(result.makespan, clock[rank]);
  }
  return result;
}

}  // namespace lattice::pipeline
