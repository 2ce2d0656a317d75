// Deterministic sum of squares: see reduce.hpp. The input is cut into fixed chunks of kChunk
// elements; each chunk is summed in double by the same code whichever thread runs it, and the
// per-chunk sums are added in chunk order by one thread, so the result depends on n and the data
// only.
#include "lattice/kernels/cpu/reduce.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {
namespace {

constexpr int64_t kChunk = 1 << 14;

// Squares are exact in double (24-bit mantissas), so only the additions round. (maskz_cvtps_pd with
// a full mask is cvtps_pd; it avoids a GCC 12 -Wmaybe-uninitialized false positive in the
// intrinsic.)
double chunk_sum_of_squares(const float* x, int64_t n) {
  int64_t i = 0;
  double total = 0.0;
#if defined(__AVX512F__)
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
#endif
  for (; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

}  // namespace

double sum_of_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 1) return chunk_sum_of_squares(x, n);
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    partial[static_cast<size_t>(c)] = chunk_sum_of_squares(x + begin, std::min(kChunk, n - begin));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

double sum_of_squares_of_runs(std::span<const FloatRun> runs) {
  // Work items: each run's chunks, as sum_of_squares cuts them.
  const RunChunks chunks(runs, kChunk);
  std::vector<double> partial(static_cast<size_t>(chunks.count()));
#pragma omp parallel for schedule(static) if (chunks.count() > 1)
  for (int64_t item = 0; item < chunks.count(); ++item) {
    const RunChunks::Item c = chunks.at(item);
    partial[static_cast<size_t>(item)] =
        chunk_sum_of_squares(runs[c.run].data + c.begin, c.end - c.begin);
  }
  // Per run in chunk order (as sum_of_squares), then the runs in order.
  double total = 0.0;
  for (size_t r = 0; r < runs.size(); ++r) {
    double run_total = 0.0;
    for (int64_t item = chunks.first(r); item < chunks.first(r + 1); ++item)
      run_total += partial[static_cast<size_t>(item)];
    total += run_total;
  }
  return total;
}

}  // namespace lattice::kernels
