// CommunicationClock: the communication time the training thread waits for (exposed), added up by
// every piece of data parallelism that waits on a collective, taken once per step for the metrics.
#pragma once

#include <chrono>

#include "lattice/comm/communicator.hpp"

namespace lattice::parallel {

class CommunicationClock {
 public:
  using Clock = std::chrono::steady_clock;

  // Waits for `handle`, counting the time waited.
  void wait(comm::CommHandle& handle) {
    const auto start = Clock::now();
    handle.wait();
    add_since(start);
  }
  // Counts the time since `start` (a blocking collective that began then).
  void add_since(Clock::time_point start) {
    seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  }
  // The seconds waited since the last take.
  double take() {
    const double s = seconds_;
    seconds_ = 0;
    return s;
  }

 private:
  double seconds_ = 0;
};

}  // namespace lattice::parallel
