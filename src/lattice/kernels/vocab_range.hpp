// A tensor-parallel rank's slice of the vocabulary, as the embedding and the loss take it.
#pragma once

#include <cstdint>
#include <limits>

namespace lattice::kernels {

// Vocabulary rows [begin, end) held by this rank (its row 0 is vocabulary row `begin`); the
// default is every row.
struct VocabRange {
  int64_t begin = 0;
  int64_t end = std::numeric_limits<int64_t>::max();

  bool contains(int64_t row) const { return row >= begin && row < end; }
};

}  // namespace lattice::kernels
