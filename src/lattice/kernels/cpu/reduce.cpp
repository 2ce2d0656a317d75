// Deterministic sum of squares: see reduce.hpp. Each chunk is summed by the best tier this CPU
// has (reduce_isa.hpp). The input is cut into fixed chunks of kChunk
// elements; each chunk is summed in double by the same code whichever thread runs it, and the
// per-chunk sums are added in chunk order by one thread, so the result depends on n and the data
// only.
#include "lattice/kernels/cpu/reduce.hpp"

#include <algorithm>
#include <vector>

#include "lattice/core/cpu_features.hpp"
#include "lattice/kernels/cpu/reduce_isa.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {
namespace {

constexpr int64_t kChunk = 1 << 14;

// The chunk's sum in the best tier this CPU has (reduce_isa.hpp).
double chunk_sum_of_squares(const float* x, int64_t n) {
  static const auto chosen =
      cpu_features().avx512() ? avx512::chunk_sum_of_squares : portable_chunk_sum_of_squares;
  return chosen(x, n);
}

}  // namespace

// Squares are exact in double (24-bit mantissas), so only the additions round.
double portable_chunk_sum_of_squares(const float* x, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

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

void sum_of_squares_each(std::span<const FloatRun> runs, double* sums) {
  // Work items: each run's chunks, as sum_of_squares cuts them.
  const RunChunks chunks(runs, kChunk);
  std::vector<double> partial(static_cast<size_t>(chunks.count()));
#pragma omp parallel for schedule(static) if (chunks.count() > 1)
  for (int64_t item = 0; item < chunks.count(); ++item) {
    const RunChunks::Item c = chunks.at(item);
    partial[static_cast<size_t>(item)] =
        chunk_sum_of_squares(runs[c.run].data + c.begin, c.end - c.begin);
  }
  // Per run in chunk order (as sum_of_squares).
  for (size_t r = 0; r < runs.size(); ++r) {
    double run_total = 0.0;
    for (int64_t item = chunks.first(r); item < chunks.first(r + 1); ++item)
      run_total += partial[static_cast<size_t>(item)];
    sums[r] = run_total;
  }
}

double sum_of_squares_of_runs(std::span<const FloatRun> runs) {
  std::vector<double> sums(runs.size());
  sum_of_squares_each(runs, sums.data());
  double total = 0.0;  // the runs in order
  for (double s : sums) total += s;
  return total;
}

}  // namespace lattice::kernels
