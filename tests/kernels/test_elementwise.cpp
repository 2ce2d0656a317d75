// Tests of the elementwise helpers: zero_in_parallel clears exactly [0, n) for any length and
// thread count (ragged ends, fewer elements than threads, the serial small case).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lattice/kernels/cpu/elementwise.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

TEST(Elementwise, ZeroInParallelClearsExactlyTheRange) {
  constexpr float kSentinel = -7.5f;
  constexpr int64_t kGuard = 33;  // elements after the range that must stay untouched
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{(1 << 18) - 1},
                      int64_t{1 << 18}, int64_t{(1 << 18) + 5}, int64_t{1000003}}) {
      std::vector<float> x(static_cast<size_t>(n + kGuard), kSentinel);
      zero_in_parallel(x.data(), n);
      int64_t nonzero = 0, clobbered = 0;
      for (int64_t i = 0; i < n; ++i) nonzero += x[static_cast<size_t>(i)] != 0.0f;
      for (int64_t i = n; i < n + kGuard; ++i) clobbered += x[static_cast<size_t>(i)] != kSentinel;
      EXPECT_EQ(nonzero, 0) << "n=" << n << " threads=" << threads;
      EXPECT_EQ(clobbered, 0) << "n=" << n << " threads=" << threads;
    }
  }
}

}  // namespace
}  // namespace lattice::kernels
