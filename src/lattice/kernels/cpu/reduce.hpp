// Deterministic reductions for gradient norms: the sum of squares accumulated in double over fixed
// chunks, so the result does not depend on the thread count.
#pragma once

#include <cstdint>

namespace lattice::kernels {

double sum_of_squares(const float* x, int64_t n);

}  // namespace lattice::kernels
