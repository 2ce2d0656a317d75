// RecordClock (the time-stamp counter scaled to steady-clock nanoseconds): it keeps the steady
// clock's rate, and never runs backwards on one thread.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "lattice/comm/record_clock.hpp"

namespace lattice::comm {
namespace {

TEST(RecordClock, FollowsTheSteadyClock) {
  RecordClock clock;
  const int64_t steady_before = RecordClock::steady_now();
  const int64_t before = clock.now();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int64_t after = clock.now();
  const int64_t steady_after = RecordClock::steady_now();
  // Same rate: 30 ms of sleep measure the same on both clocks to within 0.5% (the two readings of
  // each clock are taken back to back, microseconds apart).
  const double steady_elapsed = static_cast<double>(steady_after - steady_before);
  const double elapsed = static_cast<double>(after - before);
  EXPECT_GE(steady_elapsed, 30e6);
  EXPECT_NEAR(elapsed / steady_elapsed, 1.0, 0.005) << "uses the counter: " << clock.uses_counter();
}

TEST(RecordClock, NeverRunsBackwardsOnOneThread) {
  RecordClock clock;
  int64_t previous = clock.now();
  for (int i = 0; i < 1000000; ++i) {
    const int64_t now = clock.now();
    ASSERT_GE(now, previous);
    previous = now;
  }
}

}  // namespace
}  // namespace lattice::comm
