// Elementwise helpers: see elementwise.hpp.
#include "lattice/kernels/cpu/elementwise.hpp"

#include <cstring>

namespace lattice::kernels {

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* accumulator, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) accumulator[i] += x[i];
}

void scale_inplace(float* x, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void copy(float* out, const float* in, int64_t n) {
  if (n > 0 && out != in) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace lattice::kernels
