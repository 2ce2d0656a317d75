// Elementwise helpers: see elementwise.hpp.
#include "lattice/kernels/cpu/elementwise.hpp"

#include <algorithm>
#include <cstring>

#include <omp.h>

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

void zero_in_parallel(float* x, int64_t n) {
  if (n <= 0) return;
  constexpr int64_t kSerialBelow = 1 << 18;  // 1 MiB: below this a thread team costs more
  const int threads = n < kSerialBelow ? 1 : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    // Slices of whole cache lines (16 floats), the last one taking the remainder.
    const int64_t per = (n / team + 15) / 16 * 16;
    const int64_t begin = std::min(n, t * per), end = t + 1 == team ? n : std::min(n, begin + per);
    if (end > begin) std::memset(x + begin, 0, static_cast<size_t>(end - begin) * sizeof(float));
  }
}

}  // namespace lattice::kernels
