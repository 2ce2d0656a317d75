// The collective benchmark's helpers (lattice bench comm): every rank agrees on each timing, and
// the memory-copy bound exists exactly for the ops that only move data. These check behaviour,
// not speed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/benchmark.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

TEST(CommBenchmark, EveryRankReportsTheSameTimesAndTheCopyBoundOnlyForDataMovingOps) {
  const int n = 3;
  const int64_t bytes = 96 * 1024;
  std::vector<double> collective(n), gather_copy(n), allreduce_copy(n), broadcast_copy(n);
  const std::vector<float> shared_source(bytes / 4, 1.0f);  // read by every rank thread
  run_local_ranks(n, [&](Communicator& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    collective[r] = time_collective(comm, CollectiveOp::all_gather, bytes, 0.001).seconds;
    gather_copy[r] =
        time_output_copy(comm, CollectiveOp::all_gather, bytes, 0.001, 1, shared_source.data());
    broadcast_copy[r] = time_output_copy(comm, CollectiveOp::broadcast, bytes, 0.001);
    allreduce_copy[r] = time_output_copy(comm, CollectiveOp::allreduce, bytes, 0.001);
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(collective[r], collective[0]);
    EXPECT_EQ(gather_copy[r], gather_copy[0]);
    EXPECT_EQ(broadcast_copy[r], broadcast_copy[0]);
  }
  EXPECT_GT(collective[0], 0.0);
  EXPECT_GT(gather_copy[0], 0.0);
  EXPECT_GT(broadcast_copy[0], 0.0);  // the root copies nothing, the others a whole buffer
  EXPECT_EQ(allreduce_copy[0], 0.0);  // a reduction has no pure-copy bound
}

// Several timed runs, the median reported: still one agreed answer, and the result says how many
// runs it came from; a trial count below one is refused with the option's name.
TEST(CommBenchmark, TrialsReportTheMedianRunOnEveryRank) {
  const int n = 2;
  std::vector<BenchResult> results(n);
  run_local_ranks(n, [&](Communicator& comm) {
    results[static_cast<size_t>(comm.rank())] =
        time_collective(comm, CollectiveOp::allreduce, 4096, 0.001, 5);
  });
  EXPECT_EQ(results[1].seconds, results[0].seconds);
  EXPECT_GT(results[0].seconds, 0.0);
  EXPECT_EQ(results[0].trials, 5);
  EXPECT_GE(results[0].iterations, 3);
  run_local_ranks(n, [&](Communicator& comm) {
    EXPECT_THROW(
        {
          try {
            time_collective(comm, CollectiveOp::allreduce, 4096, 0.001, 0);
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("trials must be at least 1"), std::string::npos);
            throw;
          }
        },
        Error);
  });
}

}  // namespace
}  // namespace lattice::comm
