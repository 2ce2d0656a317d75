// Completeness and deadlock checks of pipeline schedules (see checker.hpp).
#include "lattice/parallel/pipeline/checker.hpp"

#include <map>
#include <tuple>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/replay.hpp"

namespace lattice::pipeline {
namespace {

CheckReport fail(const std::string& problem) {
  return {false, problem};
}

// The rank a send/recv of this action must name as its peer.
int expected_peer(const Schedule& schedule, const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendForward:
    case ActionKind::kRecvBackward:
      return schedule.stage_owner[a.stage + 1];
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
      return schedule.stage_owner[a.stage - 1];
    default:
      return -1;
  }
}

bool transfer_needed(const Schedule& schedule, const Action& a) {
  const int stages = schedule.num_stages();
  switch (a.kind) {
    case ActionKind::kSendForward:
    case ActionKind::kRecvBackward:
      return a.stage + 1 < stages &&
             schedule.stage_owner[a.stage + 1] != schedule.stage_owner[a.stage];
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
      return a.stage > 0 && schedule.stage_owner[a.stage - 1] != schedule.stage_owner[a.stage];
    default:
      return false;
  }
}

}  // namespace

CheckReport check_schedule(const Schedule& schedule) {
  const int stages = schedule.num_stages();
  const int mbs = schedule.num_microbatches;
  if (schedule.num_ranks < 1 || mbs < 1 || stages < schedule.num_ranks)
    return fail("schedule has no ranks, no microbatches or fewer stages than ranks");
  if (static_cast<int>(schedule.actions.size()) != schedule.num_ranks)
    return fail("schedule has action lists for " + std::to_string(schedule.actions.size()) +
                " ranks but declares " + std::to_string(schedule.num_ranks));
  for (int stage = 0; stage < stages; ++stage) {
    const int owner = schedule.stage_owner[stage];
    if (owner < 0 || owner >= schedule.num_ranks)
      return fail("stage " + std::to_string(stage) + " is owned by nonexistent rank " +
                  std::to_string(owner));
  }
  std::map<std::tuple<int, int, int>, int> counts;  // (kind, stage, mb) -> occurrences
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    for (const Action& a : schedule.actions[rank]) {
      if (a.stage < 0 || a.stage >= stages || a.microbatch < 0 || a.microbatch >= mbs)
        return fail("rank " + std::to_string(rank) + " has out-of-range " + describe(a));
      if (schedule.stage_owner[a.stage] != rank)
        return fail("rank " + std::to_string(rank) + " runs " + describe(a) + " but stage " +
                    std::to_string(a.stage) + " belongs to rank " +
                    std::to_string(schedule.stage_owner[a.stage]));
      if (a.kind == ActionKind::kBackwardWeight && !schedule.splits_weight_gradient)
        return fail("rank " + std::to_string(rank) + " has " + describe(a) +
                    " but the schedule does not split weight gradients");
      if (!is_compute(a.kind)) {
        if (!transfer_needed(schedule, a))
          return fail("rank " + std::to_string(rank) + " has " + describe(a) +
                      " between stages on the same rank or past the pipeline's end");
        if (a.peer != expected_peer(schedule, a))
          return fail("rank " + std::to_string(rank) + " has " + describe(a) +
                      " but the peer is rank " + std::to_string(expected_peer(schedule, a)));
      }
      ++counts[{static_cast<int>(a.kind), a.stage, a.microbatch}];
    }
  }
  auto expect_once = [&](ActionKind kind, int stage, int mb, bool needed) -> CheckReport {
    const auto it = counts.find({static_cast<int>(kind), stage, mb});
    const int count = it == counts.end() ? 0 : it->second;
    const int want = needed ? 1 : 0;
    if (count != want)
      return fail(describe({kind, stage, mb, -1}) + " appears " + std::to_string(count) +
                  " times; expected " + std::to_string(want));
    return {};
  };
  for (int stage = 0; stage < stages; ++stage) {
    for (int mb = 0; mb < mbs; ++mb) {
      for (auto kind : {ActionKind::kForward, ActionKind::kBackward}) {
        if (auto r = expect_once(kind, stage, mb, true); !r.ok) return r;
      }
      if (auto r =
              expect_once(ActionKind::kBackwardWeight, stage, mb, schedule.splits_weight_gradient);
          !r.ok)
        return r;
      for (auto kind : {ActionKind::kSendForward, ActionKind::kRecvForward,
                        ActionKind::kSendBackward, ActionKind::kRecvBackward}) {
        const Action probe{kind, stage, mb, -1};
        if (auto r = expect_once(kind, stage, mb, transfer_needed(schedule, probe)); !r.ok)
          return r;
      }
    }
  }
  const ReplayResult replayed = replay(schedule, uniform_costs(1, 2, 1));
  if (!replayed.completed) return fail("schedule deadlocks: " + replayed.stall);
  return {};
}

void require_valid_schedule(const Schedule& schedule) {
  const CheckReport report = check_schedule(schedule);
  if (!report.ok)
    throw Error("invalid " + schedule_kind_name(schedule.kind) + " schedule: " + report.problem);
}

}  // namespace lattice::pipeline
