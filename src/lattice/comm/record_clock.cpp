// RecordClock: the calibration of the time-stamp counter against the steady clock, made once per
// process and then only read.
#include "lattice/comm/record_clock.hpp"

#include <chrono>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace lattice::comm {
namespace {

struct CounterScale {
  bool usable = false;
  int64_t origin_ticks = 0;
  int64_t origin_ns = 0;
  double ns_per_tick = 0.0;
};

#if defined(__x86_64__)
bool invariant_counter() {  // CPUID 0x80000007, EDX bit 8: the counter runs at a constant rate
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, eax, ebx, ecx, edx);
  return (edx >> 8) & 1u;
}

CounterScale calibrate() {
  CounterScale scale;
  if (!invariant_counter()) return scale;
  // Two (steady, counter) pairs 2 ms apart: the steady clock's ~20 ns reading jitter leaves a
  // rate error of ~1e-5, i.e. ~10 ns per millisecond of measured duration.
  const int64_t ns0 = RecordClock::steady_now();
  const auto ticks0 = static_cast<int64_t>(__rdtsc());
  int64_t ns1 = ns0;
  while (ns1 - ns0 < 2'000'000) ns1 = RecordClock::steady_now();
  const auto ticks1 = static_cast<int64_t>(__rdtsc());
  if (ticks1 <= ticks0) return scale;
  scale.usable = true;
  scale.origin_ticks = ticks0;
  scale.origin_ns = ns0;
  scale.ns_per_tick = static_cast<double>(ns1 - ns0) / static_cast<double>(ticks1 - ticks0);
  return scale;
}
#else
CounterScale calibrate() {
  return {};
}
#endif

}  // namespace

int64_t RecordClock::steady_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

RecordClock::RecordClock() {
  static const CounterScale scale = calibrate();  // once per process, then read-only
  uses_counter_ = scale.usable;
  origin_ticks_ = scale.origin_ticks;
  origin_ns_ = scale.origin_ns;
  ns_per_tick_ = scale.ns_per_tick;
}

}  // namespace lattice::comm
