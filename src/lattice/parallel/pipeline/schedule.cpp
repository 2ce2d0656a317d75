// Generators of pipeline schedules as per-rank action lists: GPipe, 1F1B (PipeDream-Flush),
// Megatron's interleaved 1F1B and zero-bubble ZB-H1 (Qi et al., ICLR 2024).
#include "lattice/parallel/pipeline/schedule.hpp"

#include <algorithm>
#include <deque>

#include "lattice/core/error.hpp"

namespace lattice::pipeline {
namespace {

// Appends compute actions together with the transfers they need, for a schedule whose stages are
// owned by `stage_owner`: a forward is preceded by its RECV_F and followed by its SEND_F when the
// neighbouring stage lives on another rank; a backward likewise with RECV_B / SEND_B.
class ActionListBuilder {
 public:
  explicit ActionListBuilder(const Schedule& schedule) : schedule_(schedule) {}

  void forward(std::vector<Action>& list, int stage, int microbatch) const {
    const int last = schedule_.num_stages() - 1;
    const int rank = schedule_.stage_owner[stage];
    if (stage > 0 && schedule_.stage_owner[stage - 1] != rank)
      list.push_back(
          {ActionKind::kRecvForward, stage, microbatch, schedule_.stage_owner[stage - 1]});
    list.push_back({ActionKind::kForward, stage, microbatch, -1});
    if (stage < last && schedule_.stage_owner[stage + 1] != rank)
      list.push_back(
          {ActionKind::kSendForward, stage, microbatch, schedule_.stage_owner[stage + 1]});
  }

  void backward(std::vector<Action>& list, int stage, int microbatch) const {
    const int last = schedule_.num_stages() - 1;
    const int rank = schedule_.stage_owner[stage];
    if (stage < last && schedule_.stage_owner[stage + 1] != rank)
      list.push_back(
          {ActionKind::kRecvBackward, stage, microbatch, schedule_.stage_owner[stage + 1]});
    list.push_back({ActionKind::kBackward, stage, microbatch, -1});
    if (stage > 0 && schedule_.stage_owner[stage - 1] != rank)
      list.push_back(
          {ActionKind::kSendBackward, stage, microbatch, schedule_.stage_owner[stage - 1]});
  }

  static void weight(std::vector<Action>& list, int stage, int microbatch) {
    list.push_back({ActionKind::kBackwardWeight, stage, microbatch, -1});
  }

 private:
  const Schedule& schedule_;
};

Schedule empty_schedule(ScheduleKind kind, int num_ranks, int num_microbatches, int chunks) {
  check(num_ranks >= 1, "pipeline needs at least 1 rank (got " + std::to_string(num_ranks) + ")");
  check(num_microbatches >= 1,
        "pipeline needs at least 1 microbatch (got " + std::to_string(num_microbatches) + ")");
  Schedule schedule;
  schedule.kind = kind;
  schedule.num_ranks = num_ranks;
  schedule.num_microbatches = num_microbatches;
  schedule.chunks_per_rank = chunks;
  schedule.stage_owner.resize(static_cast<size_t>(num_ranks) * chunks);
  for (int stage = 0; stage < num_ranks * chunks; ++stage)
    schedule.stage_owner[stage] = stage % num_ranks;  // chunk c of rank r is stage c*p + r
  schedule.actions.assign(num_ranks, {});
  return schedule;
}

}  // namespace

std::string schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kZeroBubbleV:
      return "zb-v";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved" || name == "interleaved-1f1b") return ScheduleKind::kInterleaved;
  if (name == "zb-h1" || name == "zbh1") return ScheduleKind::kZeroBubbleH1;
  if (name == "zb-v" || name == "zbv") return ScheduleKind::kZeroBubbleV;
  throw Error("unknown pipeline schedule '" + name +
              "': use gpipe, 1f1b, interleaved, zb-h1 or zb-v");
}

Schedule make_gpipe(int num_ranks, int num_microbatches) {
  Schedule schedule = empty_schedule(ScheduleKind::kGPipe, num_ranks, num_microbatches, 1);
  const ActionListBuilder builder(schedule);
  for (int rank = 0; rank < num_ranks; ++rank) {
    auto& list = schedule.actions[rank];
    for (int mb = 0; mb < num_microbatches; ++mb) builder.forward(list, rank, mb);
    for (int mb = 0; mb < num_microbatches; ++mb) builder.backward(list, rank, mb);
  }
  return schedule;
}

Schedule make_one_f_one_b(int num_ranks, int num_microbatches) {
  Schedule schedule = empty_schedule(ScheduleKind::kOneFOneB, num_ranks, num_microbatches, 1);
  const ActionListBuilder builder(schedule);
  for (int rank = 0; rank < num_ranks; ++rank) {
    auto& list = schedule.actions[rank];
    const int warmup = std::min(num_ranks - rank - 1, num_microbatches);
    for (int mb = 0; mb < warmup; ++mb) builder.forward(list, rank, mb);
    for (int i = 0; i < num_microbatches - warmup; ++i) {
      builder.forward(list, rank, warmup + i);
      builder.backward(list, rank, i);
    }
    for (int mb = num_microbatches - warmup; mb < num_microbatches; ++mb)
      builder.backward(list, rank, mb);
  }
  return schedule;
}

// Megatron-LM's interleaved schedule (Narayanan et al., SC21, §2.2.2): microbatches run in groups
// of p through chunk 0, then chunk 1, ...; warmup is (p - rank - 1) * 2 + (v - 1) * p forward
// steps.
Schedule make_interleaved(int num_ranks, int num_microbatches, int chunks_per_rank) {
  check(chunks_per_rank >= 2, "interleaved schedule needs at least 2 chunks per rank (got " +
                                  std::to_string(chunks_per_rank) + "); use 1f1b for one chunk");
  check(num_microbatches % num_ranks == 0,
        "interleaved schedule needs microbatches (" + std::to_string(num_microbatches) +
            ") to be a multiple of pipeline ranks (" + std::to_string(num_ranks) + ")");
  Schedule schedule =
      empty_schedule(ScheduleKind::kInterleaved, num_ranks, num_microbatches, chunks_per_rank);
  const ActionListBuilder builder(schedule);
  const int p = num_ranks;
  const int v = chunks_per_rank;
  const int total = num_microbatches * v;
  auto chunk_of = [&](int step, bool forward) {
    const int chunk = (step / p) % v;
    return forward ? chunk : v - 1 - chunk;
  };
  auto microbatch_of = [&](int step) { return (step / (p * v)) * p + step % p; };
  for (int rank = 0; rank < p; ++rank) {
    auto& list = schedule.actions[rank];
    const int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, total);
    for (int step = 0; step < warmup; ++step)
      builder.forward(list, chunk_of(step, true) * p + rank, microbatch_of(step));
    for (int step = 0; step < total - warmup; ++step) {
      const int forward_step = warmup + step;
      builder.forward(list, chunk_of(forward_step, true) * p + rank, microbatch_of(forward_step));
      builder.backward(list, chunk_of(step, false) * p + rank, microbatch_of(step));
    }
    for (int step = total - warmup; step < total; ++step)
      builder.backward(list, chunk_of(step, false) * p + rank, microbatch_of(step));
  }
  return schedule;
}

// ZB-H1 built by list scheduling with unit costs (T_F = T_B = T_W, free transfers): each rank keeps
// 1F1B's order of F and B (so 1F1B's activation memory) and runs a pending W whenever its next F or
// B is not ready yet; rank r keeps at most r + 1 weight gradients pending. This moves W passes into
// 1F1B's bubbles: bubble (p - 1)(T_F + T_B - T_W).
Schedule make_zero_bubble_h1(int num_ranks, int num_microbatches) {
  const Schedule order = make_one_f_one_b(num_ranks, num_microbatches);
  Schedule schedule = empty_schedule(ScheduleKind::kZeroBubbleH1, num_ranks, num_microbatches, 1);
  schedule.splits_weight_gradient = true;
  const ActionListBuilder builder(schedule);
  const int p = num_ranks;
  const int m = num_microbatches;
  constexpr long kNotYet = -1;
  // The F/B sequence of each rank, from 1F1B.
  std::vector<std::vector<Action>> compute_order(p);
  for (int rank = 0; rank < p; ++rank)
    for (const Action& a : order.actions[rank])
      if (is_compute(a.kind)) compute_order[rank].push_back(a);
  // finish time (in unit steps) of F and B of (rank, microbatch)
  std::vector<std::vector<long>> forward_done(p, std::vector<long>(m, kNotYet));
  std::vector<std::vector<long>> backward_done(p, std::vector<long>(m, kNotYet));
  std::vector<size_t> next(p, 0);
  std::vector<std::deque<int>> pending_weight(p);
  std::vector<long> busy_until(p, 0);
  auto finished_by = [](long done, long time) { return done != kNotYet && done <= time; };
  int remaining = p * m * 3;
  for (long time = 0; remaining > 0; ++time) {
    for (int rank = 0; rank < p; ++rank) {
      if (busy_until[rank] > time) continue;
      auto& list = schedule.actions[rank];
      bool next_ready = false;
      const Action* upcoming =
          next[rank] < compute_order[rank].size() ? &compute_order[rank][next[rank]] : nullptr;
      if (upcoming && upcoming->kind == ActionKind::kForward)
        next_ready = rank == 0 || finished_by(forward_done[rank - 1][upcoming->microbatch], time);
      if (upcoming && upcoming->kind == ActionKind::kBackward)
        next_ready =
            rank == p - 1 || finished_by(backward_done[rank + 1][upcoming->microbatch], time);
      const bool must_drain_weight = static_cast<int>(pending_weight[rank].size()) > rank + 1;
      if (!must_drain_weight && next_ready) {
        const int mb = upcoming->microbatch;
        if (upcoming->kind == ActionKind::kForward) {
          builder.forward(list, rank, mb);
          forward_done[rank][mb] = time + 1;
        } else {
          builder.backward(list, rank, mb);
          backward_done[rank][mb] = time + 1;
          pending_weight[rank].push_back(mb);
        }
        ++next[rank];
      } else if (!pending_weight[rank].empty()) {
        builder.weight(list, rank, pending_weight[rank].front());
        pending_weight[rank].pop_front();
      } else {
        continue;
      }
      busy_until[rank] = time + 1;
      --remaining;
    }
  }
  return schedule;
}

// ZB-V (Qi et al., "Pipeline parallelism with controllable memory", 2024): every rank owns two
// chunks in a V, stage r and stage 2p - 1 - r, so the first and last stages share rank 0 and the
// turn of the V needs no transfer. Built by list scheduling with unit costs (T_F = T_B = T_W): an
// idle rank runs a ready B (later stage first), else a ready F (later stage first) while its
// in-flight chunk activations stay under 2p (1F1B's peak memory in whole-stage units), else a
// pending W.
Schedule make_zero_bubble_v(int num_ranks, int num_microbatches) {
  Schedule schedule = empty_schedule(ScheduleKind::kZeroBubbleV, num_ranks, num_microbatches, 2);
  schedule.splits_weight_gradient = true;
  const int p = num_ranks;
  const int m = num_microbatches;
  const int stages = 2 * p;
  for (int stage = 0; stage < stages; ++stage)
    schedule.stage_owner[stage] = stage < p ? stage : stages - 1 - stage;
  const ActionListBuilder builder(schedule);
  constexpr long kNotYet = -1;
  std::vector<std::vector<long>> forward_done(stages, std::vector<long>(m, kNotYet));
  std::vector<std::vector<long>> backward_done(stages, std::vector<long>(m, kNotYet));
  std::vector<int> next_forward(stages, 0), next_backward(stages, 0), in_flight(p, 0);
  std::vector<std::deque<std::pair<int, int>>> pending_weight(p);
  std::vector<long> busy_until(p, 0);
  auto finished_by = [](long done, long time) { return done != kNotYet && done <= time; };
  int remaining = stages * m * 3;
  for (long time = 0; remaining > 0; ++time) {
    for (int rank = 0; rank < p; ++rank) {
      if (busy_until[rank] > time) continue;
      auto& list = schedule.actions[rank];
      const int chunk_stages[2] = {stages - 1 - rank, rank};  // later stage first
      bool done = false;
      for (int stage : chunk_stages) {  // a ready backward
        const int mb = next_backward[stage];
        if (mb >= m || !finished_by(forward_done[stage][mb], time)) continue;
        if (stage < stages - 1 && !finished_by(backward_done[stage + 1][mb], time)) continue;
        builder.backward(list, stage, mb);
        backward_done[stage][mb] = time + 1;
        pending_weight[rank].push_back({stage, mb});
        ++next_backward[stage];
        --in_flight[rank];
        done = true;
        break;
      }
      for (int i = 0; !done && i < 2 && in_flight[rank] < 2 * p; ++i) {  // a ready forward
        const int stage = chunk_stages[i];
        const int mb = next_forward[stage];
        if (mb >= m || (stage > 0 && !finished_by(forward_done[stage - 1][mb], time))) continue;
        builder.forward(list, stage, mb);
        forward_done[stage][mb] = time + 1;
        ++next_forward[stage];
        ++in_flight[rank];
        done = true;
      }
      if (!done && !pending_weight[rank].empty()) {
        const auto [stage, mb] = pending_weight[rank].front();
        pending_weight[rank].pop_front();
        builder.weight(list, stage, mb);
        done = true;
      }
      if (!done) continue;
      busy_until[rank] = time + 1;
      --remaining;
    }
  }
  return schedule;
}

Schedule make_schedule(ScheduleKind kind, int num_ranks, int num_microbatches,
                       int chunks_per_rank) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return make_gpipe(num_ranks, num_microbatches);
    case ScheduleKind::kOneFOneB:
      return make_one_f_one_b(num_ranks, num_microbatches);
    case ScheduleKind::kInterleaved:
      return make_interleaved(num_ranks, num_microbatches, chunks_per_rank);
    case ScheduleKind::kZeroBubbleH1:
      return make_zero_bubble_h1(num_ranks, num_microbatches);
    case ScheduleKind::kZeroBubbleV:
      return make_zero_bubble_v(num_ranks, num_microbatches);
  }
  throw Error("unknown pipeline schedule kind");
}

}  // namespace lattice::pipeline
