// Local backend: every collective and algorithm against the serial reference for n in
// {1,2,3,4,5,8}, counts {0, 1, 7, 1023} in every element type, and 1,000,003 elements for a subset.
#include <gtest/gtest.h>

#include <mutex>

#include "collective_suite.hpp"
#include "lattice/comm/backends/local.hpp"

namespace lattice::comm {
namespace {

using testing::Failures;

CommOptions test_options(int ranks_per_node = 0) {
  CommOptions options;
  options.timeout = std::chrono::seconds(120);
  options.ranks_per_node = ranks_per_node;
  return options;
}

// Runs the suite on n thread-ranks with `algorithm` forced; returns all ranks' failures.
std::vector<std::string> run_suite(int n, Algorithm algorithm, const std::vector<int64_t>& counts,
                                   const std::vector<DType>& dtypes, int ranks_per_node = 0) {
  std::mutex mutex;
  std::vector<std::string> all;
  run_local_ranks(
      n,
      [&](Communicator& comm) {
        testing::force_algorithm(comm, algorithm);
        Failures failures;
        testing::run_collective_suite(comm, counts, dtypes, failures);
        std::lock_guard lock(mutex);
        all.insert(all.end(), failures.lines.begin(), failures.lines.end());
      },
      test_options(ranks_per_node));
  return all;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

class LocalSuite : public ::testing::TestWithParam<std::tuple<int, Algorithm>> {};

TEST_P(LocalSuite, SmallCountsEveryTypeMatchReference) {
  auto [n, algorithm] = GetParam();
  auto failures = run_suite(n, algorithm, {0, 1, 7, 1023}, testing::all_dtypes());
  EXPECT_TRUE(failures.empty()) << join(failures);
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndAlgorithms, LocalSuite,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(Algorithm::direct, Algorithm::ring, Algorithm::tree,
                                         Algorithm::halving_doubling, Algorithm::pairwise)),
    [](const auto& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" +
             std::string(algorithm_name(std::get<1>(info.param)));
    });

class LocalLargeCount : public ::testing::TestWithParam<std::tuple<int, Algorithm>> {};

TEST_P(LocalLargeCount, MillionElementsMatchReference) {
  auto [n, algorithm] = GetParam();
  auto failures = run_suite(n, algorithm, {1000003}, {DType::f32, DType::bf16});
  EXPECT_TRUE(failures.empty()) << join(failures);
}

INSTANTIATE_TEST_SUITE_P(
    Subset, LocalLargeCount,
    ::testing::Values(std::make_tuple(1, Algorithm::direct), std::make_tuple(2, Algorithm::direct),
                      std::make_tuple(3, Algorithm::direct), std::make_tuple(8, Algorithm::direct),
                      std::make_tuple(3, Algorithm::ring), std::make_tuple(5, Algorithm::ring),
                      std::make_tuple(5, Algorithm::tree),
                      std::make_tuple(3, Algorithm::halving_doubling),
                      std::make_tuple(4, Algorithm::pairwise)),
    [](const auto& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" +
             std::string(algorithm_name(std::get<1>(info.param)));
    });

TEST(LocalLargeCount, MillionElementsIntegerTypes) {
  auto failures = run_suite(3, Algorithm::ring, {1000003}, {DType::f16, DType::i32, DType::i64});
  EXPECT_TRUE(failures.empty()) << join(failures);
}

// Two-level allreduce with emulated nodes: 2 nodes of 2, 3 nodes of 2 (one short), 2 nodes of 4.
TEST(LocalHierarchical, EmulatedNodesMatchReference) {
  for (auto [n, per_node] : {std::pair{4, 2}, std::pair{5, 2}, std::pair{8, 4}, std::pair{3, 1}}) {
    auto failures =
        run_suite(n, Algorithm::hierarchical, {0, 1, 7, 1023}, testing::all_dtypes(), per_node);
    EXPECT_TRUE(failures.empty()) << "n " << n << " per node " << per_node << "\n"
                                  << join(failures);
  }
  auto failures = run_suite(4, Algorithm::hierarchical, {1000003}, {DType::f32}, 2);
  EXPECT_TRUE(failures.empty()) << join(failures);
}

TEST(LocalHierarchical, NodeLayoutFollowsEmulation) {
  run_local_ranks(
      5,
      [](Communicator& comm) {
        EXPECT_EQ(comm.node(), comm.rank() / 2);
        EXPECT_EQ(comm.local_rank(), comm.rank() % 2);
        EXPECT_EQ(comm.node_count(), 3);
      },
      test_options(2));
}

}  // namespace
}  // namespace lattice::comm
