// ScopedOmpThreads: sets the calling thread's OpenMP thread count for a scope and restores the
// previous one on exit (oneDNN fixes a primitive's work split when it is created; tests check that
// results do not depend on the thread count).
#pragma once

#include <omp.h>

namespace lattice {

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

}  // namespace lattice
