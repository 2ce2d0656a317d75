// Test helper: sets the OpenMP thread count for a scope and restores the previous one on exit, for
// tests that check results are bit-identical across thread counts.
#pragma once

#include <omp.h>

namespace lattice::testing {

class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() { omp_set_num_threads(previous_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_;
};

}  // namespace lattice::testing
