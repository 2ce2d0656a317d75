// Fault injection: see fault_injection.hpp.
#include "lattice/train/fault_injection.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

namespace lattice::train {

void FaultInjection::before_step(int world_rank, int64_t step) const {
  if (stall_before_step.hits(world_rank, step))
    std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds));
}

void FaultInjection::after_step(int world_rank, int64_t step) const {
  if (!kill_after_step.hits(world_rank, step)) return;
  std::fflush(stdout);
  std::raise(SIGKILL);
}

}  // namespace lattice::train
