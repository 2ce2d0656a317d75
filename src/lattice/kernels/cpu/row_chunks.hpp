// Partitions of rows into chunks. fixed_row_chunks: for deterministic parameter-gradient
// reductions, each chunk sums its rows into its own partial, and partials are reduced in chunk
// order afterwards; the partition depends only on the row count, so results are bit-identical for
// any OpenMP thread count. row_chunks_of: chunks of a given size (the row-chunk GEMMs).
// RunChunks: several runs of elements (a model's parameters) cut into chunks and numbered run after
// run, the work items of one parallel loop over all of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lattice::kernels {

struct RowChunks {
  int64_t rows_per_chunk = 1;
  int64_t count = 0;

  int64_t begin(int64_t chunk) const { return chunk * rows_per_chunk; }
  int64_t end(int64_t chunk, int64_t rows) const {
    return std::min(rows, (chunk + 1) * rows_per_chunk);
  }
};

// Chunks of `rows_per_chunk` rows (all of them in one chunk when fewer), the last one shorter when
// they do not divide: the row-chunk GEMMs' partition (MatmulEngine::multiply_in_row_chunks).
inline RowChunks row_chunks_of(int64_t rows, int64_t rows_per_chunk) {
  RowChunks chunks;
  chunks.rows_per_chunk = std::max<int64_t>(1, std::min(rows_per_chunk, rows));
  chunks.count = (rows + chunks.rows_per_chunk - 1) / chunks.rows_per_chunk;
  return chunks;
}

// Each of `runs` (anything with an element count `n`) cut into chunks of `chunk` elements from its
// start, the chunks numbered run after run (an empty run has none).
class RunChunks {
 public:
  struct Item {
    size_t run;
    int64_t begin, end;  // elements of the run
  };
  template <class Runs>
  RunChunks(const Runs& runs, int64_t chunk) : chunk_(chunk), first_(runs.size() + 1, 0) {
    for (size_t r = 0; r < runs.size(); ++r) {
      sizes_.push_back(std::max<int64_t>(0, runs[r].n));
      first_[r + 1] = first_[r] + (sizes_.back() + chunk - 1) / chunk;
    }
  }
  int64_t count() const { return first_.back(); }
  // Items [first(run), first(run + 1)) are the run's chunks, in order.
  int64_t first(size_t run) const { return first_[run]; }
  Item at(int64_t item) const {
    const auto run = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), item) -
                                         first_.begin() - 1);
    const int64_t begin = (item - first_[run]) * chunk_;
    return {run, begin, std::min(sizes_[run], begin + chunk_)};
  }

 private:
  int64_t chunk_;
  std::vector<int64_t> first_, sizes_;
};

// At most 128 chunks (bounded scratch) of at least 8 rows (partials cost little next to the rows).
inline RowChunks fixed_row_chunks(int64_t rows) {
  constexpr int64_t kMaxChunks = 128;
  constexpr int64_t kMinRowsPerChunk = 8;
  RowChunks chunks;
  chunks.rows_per_chunk = std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  chunks.count = (rows + chunks.rows_per_chunk - 1) / chunks.rows_per_chunk;
  return chunks;
}

// accumulator[c] += sum over chunks k (in order k = 0, 1, ...) of partials[k * stride + c], summed
// in double and rounded once; parallel over channel blocks, so the order per channel never changes.
// Blocks of 64 channels, so that a LayerNorm's 256 or 768 channels still split over the threads.
inline void add_chunk_partials(float* accumulator, const float* partials, int64_t chunk_count,
                               int64_t stride, int64_t C) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (chunk_count * C > 16384 && blocks > 1)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kBlock;
    const int64_t width = std::min(kBlock, C - c0);
    double sum[kBlock] = {};
    for (int64_t k = 0; k < chunk_count; ++k) {
      const float* partial = partials + k * stride + c0;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) sum[c] += static_cast<double>(partial[c]);
    }
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) {
      accumulator[c0 + c] = static_cast<float>(static_cast<double>(accumulator[c0 + c]) + sum[c]);
    }
  }
}

}  // namespace lattice::kernels
