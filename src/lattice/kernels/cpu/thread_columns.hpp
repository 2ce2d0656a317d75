// Split of the columns [0, cols) of a row-major matrix into one contiguous range per OpenMP thread
// (whole vectors of 16 columns), for column reductions that walk the rows in order: each thread
// reads a contiguous part of every row, and every column is still summed row by row, so results
// do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>

namespace lattice::kernels {

struct ColumnRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t width() const { return end - begin; }
};

// Thread `thread` of `threads`; a range may be empty when there are fewer vectors than threads.
inline ColumnRange thread_columns(int64_t cols, int64_t thread, int64_t threads) {
  const int64_t vectors = (cols + 15) / 16;
  return {std::min(cols, vectors * thread / threads * 16),
          std::min(cols, vectors * (thread + 1) / threads * 16)};
}

// Prefetches floats [begin, begin + width) of the row after row i of a [rows, cols] matrix: a
// thread's column range of consecutive rows lies on different pages, where the hardware
// prefetchers stop.
inline void prefetch_next_row(const float* matrix, int64_t i, int64_t rows, int64_t cols,
                              ColumnRange range) {
  if (i + 1 >= rows) return;
  const float* next = matrix + (i + 1) * cols + range.begin;
  for (int64_t j = 0; j < range.width(); j += 16) __builtin_prefetch(next + j);
}

}  // namespace lattice::kernels
