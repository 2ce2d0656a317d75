// Causal load balancing: see sequence_split.hpp.
#include "lattice/parallel/context/sequence_split.hpp"

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

std::vector<model::PositionRun> balanced_runs(int64_t local_len, int cp, int rank) {
  check(cp >= 1 && rank >= 0 && rank < cp && local_len > 0 && local_len % 2 == 0,
        "balanced_runs: rank " + std::to_string(rank) + " of cp " + std::to_string(cp) +
            " cannot hold " + std::to_string(local_len) + " rows as two equal chunks");
  const int64_t chunk = local_len / 2;
  return {{0, rank * chunk, chunk},
          {chunk, (2 * static_cast<int64_t>(cp) - 1 - rank) * chunk, chunk}};
}

void take_context_rows(int32_t* local, const int32_t* full, int64_t batch, int64_t seq_len, int cp,
                       int rank) {
  check_context_split(seq_len, cp);
  const int64_t local_len = seq_len / cp;
  for (int64_t b = 0; b < batch; ++b)
    for (const model::PositionRun& run : balanced_runs(local_len, cp, rank))
      std::copy_n(full + b * seq_len + run.position, run.length, local + b * local_len + run.row);
}

void check_context_split(int64_t seq_len, int cp) {
  check(cp >= 1 && seq_len % (2 * static_cast<int64_t>(cp)) == 0,
        "training.seq_len = " + std::to_string(seq_len) +
            " cannot be split over parallelism.cp = " + std::to_string(cp) +
            " ranks: the causal load balancing cuts each sequence into 2 x cp = " +
            std::to_string(2 * cp) + " equal chunks; pick a seq_len divisible by " +
            std::to_string(2 * cp));
}

}  // namespace lattice::parallel
