// Elementwise helpers used by the model (residual adds, scaling, copies), vectorised and threaded.
#pragma once

#include <cstdint>

namespace lattice::kernels {

void add(float* out, const float* a, const float* b, int64_t n);  // out = a + b (out may alias)
void add_inplace(float* accumulator, const float* x, int64_t n);  // accumulator += x
void scale_inplace(float* x, int64_t n, float factor);            // x *= factor
void copy(float* out, const float* in, int64_t n);
// x[0, n) = 0, split over the threads (large buffers such as the gradients zeroed every step: one
// thread alone leaves the others waiting).
void zero_in_parallel(float* x, int64_t n);

}  // namespace lattice::kernels
