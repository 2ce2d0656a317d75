// Pipeline schedules as data: the checker accepts every generated schedule and rejects broken ones,
// and with uniform costs the replayed bubble and in-flight microbatches match the published
// formulas
// (docs/published.md, "Pipeline bubbles": GPipe/1F1B (p-1)/(m+p-1), interleaved
// (1/v)(p-1)/m of the ideal time, ZB-H1 (p-1)/(3m) with T_F = T_B = T_W; 1F1B keeps p in flight,
// GPipe m).
#include <gtest/gtest.h>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"
#include "lattice/parallel/pipeline/replay.hpp"
#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::pipeline {
namespace {

struct Shape {
  int p;
  int m;
};
const Shape kShapes[] = {{1, 1}, {2, 2}, {2, 5}, {4, 4}, {4, 8}, {4, 16}, {8, 8}, {8, 32}, {3, 7}};

TEST(PipelineSchedule, GeneratedSchedulesPassTheChecker) {
  for (auto [p, m] : kShapes) {
    for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
      const CheckReport report = check_schedule(make_schedule(kind, p, m));
      EXPECT_TRUE(report.ok) << schedule_kind_name(kind) << " p=" << p << " m=" << m << ": "
                             << report.problem;
    }
    if (m % p == 0 && p > 1) {
      for (int v : {2, 3, 4}) {
        const CheckReport report = check_schedule(make_interleaved(p, m, v));
        EXPECT_TRUE(report.ok) << "interleaved p=" << p << " m=" << m << " v=" << v << ": "
                               << report.problem;
      }
    }
  }
}

TEST(PipelineSchedule, GPipeAndOneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (auto [p, m] : kShapes) {
    const double expected = double(p - 1) / (m + p - 1);
    for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      const ReplayResult r = replay(make_schedule(kind, p, m), uniform_costs(1, 2));
      ASSERT_TRUE(r.completed);
      EXPECT_NEAR(r.bubble_fraction(), expected, 1e-12) << schedule_kind_name(kind) << " p=" << p;
      EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (m + p - 1));
    }
  }
}

TEST(PipelineSchedule, PeakInFlightIsMForGPipeAndPForOneFOneB) {
  for (auto [p, m] : kShapes) {
    const ReplayResult gpipe = replay(make_gpipe(p, m), uniform_costs(1, 2));
    const ReplayResult one_f_one_b = replay(make_one_f_one_b(p, m), uniform_costs(1, 2));
    EXPECT_EQ(gpipe.peak_in_flight[0], m);
    EXPECT_EQ(one_f_one_b.peak_in_flight[0], std::min(p, m));
    for (int rank = 0; rank < p; ++rank)
      EXPECT_EQ(one_f_one_b.peak_in_flight[rank], std::min(p - rank, m));
  }
}

TEST(PipelineSchedule, InterleavedBubbleIsOneOverVOfOneFOneB) {
  for (auto [p, m] : {Shape{2, 4}, Shape{4, 8}, Shape{4, 16}, Shape{8, 16}, Shape{8, 64}}) {
    for (int v : {2, 3, 4}) {
      // A chunk holds 1/v of the rank's layers: F and B take 1/v of the whole stage's time.
      const ReplayResult r = replay(make_interleaved(p, m, v), uniform_costs(1.0 / v, 2.0 / v));
      ASSERT_TRUE(r.completed);
      const double ideal = 3.0 * m;
      EXPECT_NEAR((r.makespan - ideal) / ideal, (p - 1.0) / (v * m), 1e-9)
          << "p=" << p << " m=" << m << " v=" << v;
      // Korthikanti: the first stage holds 1 + (p-1)/(p*v)... of 1F1B's activations; here in chunk
      // units.
      EXPECT_LE(r.peak_in_flight[0], p * v + (p - 1) * 2 + 1);
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleH1BubbleIsPMinusOneOverThreeM) {
  for (auto [p, m] :
       {Shape{2, 4}, Shape{4, 4}, Shape{4, 8}, Shape{4, 16}, Shape{8, 8}, Shape{8, 24}}) {
    const Schedule schedule = make_zero_bubble_h1(p, m);
    const ReplayResult r = replay(schedule, uniform_costs(1, 1, 1));
    ASSERT_TRUE(r.completed);
    const double ideal = 3.0 * m;
    EXPECT_NEAR((r.makespan - ideal) / ideal, (p - 1.0) / (3.0 * m), 1e-9)
        << "p=" << p << " m=" << m;
    for (int rank = 0; rank < p; ++rank)
      EXPECT_LE(r.peak_in_flight[rank], p - rank) << "ZB-H1 keeps 1F1B's memory";
  }
}

// ZB-V: two chunks per rank in a V (rank r owns stages r and 2p-1-r), half a stage each. It keeps
// 1F1B's peak activation memory (2p half-stage chunks = p stages) and, built greedily, at least
// halves ZB-H1's bubble when m >= p.
TEST(PipelineSchedule, ZeroBubbleVBeatsZeroBubbleH1AtTheSameMemory) {
  for (auto [p, m] :
       {Shape{2, 4}, Shape{4, 4}, Shape{4, 8}, Shape{4, 16}, Shape{8, 8}, Shape{8, 32}}) {
    const Schedule v = make_zero_bubble_v(p, m);
    ASSERT_TRUE(check_schedule(v).ok) << check_schedule(v).problem;
    EXPECT_EQ(v.stage_owner[0], 0);
    EXPECT_EQ(v.stage_owner[2 * p - 1], 0);
    EXPECT_EQ(v.stage_owner[p], p - 1);
    const ReplayResult zbv = replay(v, uniform_costs(0.5, 0.5, 0.5));
    const ReplayResult zbh1 = replay(make_zero_bubble_h1(p, m), uniform_costs(1, 1, 1));
    const double ideal = 3.0 * m;
    EXPECT_LE((zbv.makespan - ideal) / ideal, 0.5 * (zbh1.makespan - ideal) / ideal + 1e-9)
        << "p=" << p << " m=" << m;
    for (int rank = 0; rank < p; ++rank) EXPECT_LE(zbv.peak_in_flight[rank], 2 * p);
  }
}

TEST(PipelineSchedule, RejectsImpossibleInputs) {
  EXPECT_THROW(make_interleaved(4, 6, 2), Error);  // m not a multiple of p
  EXPECT_THROW(make_interleaved(4, 8, 1), Error);  // one chunk is not interleaving
  EXPECT_THROW(make_one_f_one_b(4, 0), Error);
  EXPECT_THROW(make_gpipe(0, 4), Error);
  EXPECT_THROW(parse_schedule_kind("2f2b"), Error);
  EXPECT_EQ(parse_schedule_kind("zb-v"), ScheduleKind::kZeroBubbleV);
}

TEST(PipelineSchedule, CheckerFindsDeadlockAndMissingWork) {
  Schedule swapped = make_one_f_one_b(2, 2);
  // Rank 1 waits for a backward of microbatch 1 before forwarding microbatch 0: a cycle.
  auto& last = swapped.actions[1];
  std::swap(last[0], last[3]);
  std::swap(last[1], last[4]);
  CheckReport report = check_schedule(swapped);
  EXPECT_FALSE(report.ok);

  Schedule missing = make_gpipe(2, 3);
  missing.actions[0].pop_back();
  report = check_schedule(missing);
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.problem.find("expected 1"), std::string::npos) << report.problem;

  Schedule wrong_peer = make_gpipe(3, 2);
  wrong_peer.actions[0][1].peer = 2;
  EXPECT_FALSE(check_schedule(wrong_peer).ok);
  EXPECT_THROW(require_valid_schedule(wrong_peer), Error);

  // A genuine deadlock: both ranks receive before they send.
  Schedule cycle = make_gpipe(2, 1);
  std::swap(cycle.actions[0][0], cycle.actions[0][3]);  // rank 0: RECV_B first, before F
  report = check_schedule(cycle);
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.problem.find("deadlock"), std::string::npos) << report.problem;
}

}  // namespace
}  // namespace lattice::pipeline
