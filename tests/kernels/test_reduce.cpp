// Tests of the deterministic sum of squares: value against a naive double sum, bit-identical
// results for 1, 2 and 3 OpenMP threads, double accumulation (no fp32 overflow), and the many-run
// forms (their total, and each run's sum) equal to one call per run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/kernels/cpu/reduce.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

double naive_sum_of_squares(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}

TEST(Reduce, SumOfSquaresMatchesNaiveDoubleSum) {
  for (int64_t n : {0, 1, 7, 31, 32, 33, 16384, 16385, 1000003}) {
    auto x = lattice::testing::random_vector(n, 30 + static_cast<uint64_t>(n));
    const double expected = naive_sum_of_squares(x);
    // Both sums add n positive terms in double: each is within n * 2^-53 relative of the exact sum.
    const double tolerance = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53) * expected;
    EXPECT_NEAR(sum_of_squares(x.data(), n), expected, tolerance) << "n=" << n;
  }
}

TEST(Reduce, SumOfSquaresOfRunsEqualsOneCallPerRunAddedInOrder) {
  // Runs below, at and above a chunk, an empty one: the parameters of a model.
  std::vector<std::vector<float>> data;
  std::vector<FloatRun> runs;
  for (int64_t n : {int64_t{7}, int64_t{16384}, int64_t{0}, int64_t{3 * 16384 + 5}, int64_t{300}}) {
    data.push_back(lattice::testing::random_vector(n, 60 + static_cast<uint64_t>(n)));
  }
  double expected = 0.0;
  for (const auto& x : data) {
    runs.push_back({x.data(), static_cast<int64_t>(x.size())});
    expected += sum_of_squares(x.data(), static_cast<int64_t>(x.size()));
  }
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    EXPECT_EQ(sum_of_squares_of_runs(runs), expected) << threads << " threads";  // bit for bit
  }
  EXPECT_EQ(sum_of_squares_of_runs({}), 0.0);
}

TEST(Reduce, SumOfSquaresEachEqualsOneCallPerRun) {
  // The gradient norm's pieces: many runs of at most 1024 elements, an empty one, and runs of
  // several chunks, in one call.
  std::vector<std::vector<float>> data;
  for (int64_t n : {int64_t{1024}, int64_t{0}, int64_t{1000}, int64_t{16385}, int64_t{1}})
    data.push_back(lattice::testing::random_vector(n, 90 + static_cast<uint64_t>(n)));
  for (int i = 0; i < 300; ++i) data.push_back(lattice::testing::random_vector(1024, 200 + i));
  std::vector<FloatRun> runs;
  for (const auto& x : data) runs.push_back({x.data(), static_cast<int64_t>(x.size())});
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    std::vector<double> sums(runs.size(), -1.0);
    sum_of_squares_each(runs, sums.data());
    for (size_t i = 0; i < runs.size(); ++i)  // bit for bit
      ASSERT_EQ(sums[i], sum_of_squares(runs[i].data, runs[i].n)) << i << ", " << threads;
  }
}

TEST(Reduce, SumOfSquaresIsIndependentOfThreadCount) {
  const int64_t n = 5 * 16384 + 77;  // several chunks with a ragged end
  auto x = lattice::testing::random_vector(n, 40);
  std::vector<double> results;
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    results.push_back(sum_of_squares(x.data(), n));
  }
  EXPECT_EQ(results[0], results[1]);  // bit-identical, not merely close
  EXPECT_EQ(results[0], results[2]);
}

TEST(Reduce, SumOfSquaresAccumulatesInDouble) {
  // 1e20^2 = 1e40 overflows fp32 but not double.
  std::vector<float> x(100, 1e20f);
  const double expected = 100.0 * static_cast<double>(1e20f) * static_cast<double>(1e20f);
  EXPECT_NEAR(sum_of_squares(x.data(), 100), expected, 1e-13 * expected);
  // Tiny values whose fp32 squares would underflow to zero still count.
  std::vector<float> tiny(64, 1e-30f);
  EXPECT_GT(sum_of_squares(tiny.data(), 64), 0.0);
}

}  // namespace
}  // namespace lattice::kernels
