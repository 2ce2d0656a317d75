// Test helper: ScopedOmpThreads (set the OpenMP thread count for a scope) under the name the tests
// use, for tests that check results are bit-identical across thread counts.
#pragma once

#include "lattice/core/scoped_omp_threads.hpp"

namespace lattice::testing {

using ScopedOmpThreads = lattice::ScopedOmpThreads;

}  // namespace lattice::testing
