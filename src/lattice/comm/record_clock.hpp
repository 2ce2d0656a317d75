// RecordClock: the clock of collective records (entered / finished times). The processor's
// invariant time-stamp counter scaled to steady-clock nanoseconds where the processor has one: a
// counter read and a multiply, ~9 ns here against ~18 ns for std::chrono::steady_clock, and every
// collective reads it twice. Elsewhere, and where the counter is not invariant, the steady clock.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace lattice::comm {

class RecordClock {
 public:
  // Takes the process's calibration (made once, on first use: ~2 ms against the steady clock).
  RecordClock();

  // Nanoseconds on the steady clock's time line, drifting from it by the calibration's rate error
  // (~2e-5: 20 us a second after calibration). Differences are durations; readings of different
  // processes are not comparable.
  int64_t now() const {
#if defined(__x86_64__)
    if (uses_counter_) {
      const auto ticks = static_cast<int64_t>(__rdtsc()) - origin_ticks_;
      return origin_ns_ + static_cast<int64_t>(static_cast<double>(ticks) * ns_per_tick_);
    }
#endif
    return steady_now();
  }
  bool uses_counter() const {
    return uses_counter_;
  }

  static int64_t steady_now();

 private:
  bool uses_counter_ = false;
  int64_t origin_ticks_ = 0;
  int64_t origin_ns_ = 0;
  double ns_per_tick_ = 0.0;
};

}  // namespace lattice::comm
