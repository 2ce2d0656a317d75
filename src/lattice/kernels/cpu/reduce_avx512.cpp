// The AVX-512 per-chunk sum of squares (reduce_isa.hpp), compiled with the AVX-512 flags
// (CMakeLists.txt): four 8-lane double accumulators over 32 elements a step, their lanes added in
// order, then the tail.
#include <immintrin.h>

#include "lattice/kernels/cpu/reduce_isa.hpp"

namespace lattice::kernels::avx512 {

// Squares are exact in double (24-bit mantissas), so only the additions round. (maskz_cvtps_pd with
// a full mask is cvtps_pd; it avoids a GCC 12 -Wmaybe-uninitialized false positive in the
// intrinsic.)
double chunk_sum_of_squares(const float* x, int64_t n) {
  int64_t i = 0;
  double total = 0.0;
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __m512d acc2 = _mm512_setzero_pd(), acc3 = _mm512_setzero_pd();
  for (; i + 32 <= n; i += 32) {
    __m512d a = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i));
    __m512d b = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i + 8));
    __m512d c = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i + 16));
    __m512d d = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i + 24));
    acc0 = _mm512_fmadd_pd(a, a, acc0);
    acc1 = _mm512_fmadd_pd(b, b, acc1);
    acc2 = _mm512_fmadd_pd(c, c, acc2);
    acc3 = _mm512_fmadd_pd(d, d, acc3);
  }
  __m512d acc = _mm512_add_pd(_mm512_add_pd(acc0, acc1), _mm512_add_pd(acc2, acc3));
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, acc);
  for (double lane : lanes) total += lane;
  for (; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

}  // namespace lattice::kernels::avx512
