// Causal load balancing for context parallelism: each sequence of T tokens is cut into 2·cp
// chunks of T / (2·cp), and cp rank r holds chunks r and 2·cp − 1 − r (an early and a late one),
// so under a causal mask every rank attends the same number of (query, key) pairs. The data
// loader's sequences, RoPE angles and GPT-2's learned positions all follow this split.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/model/context_parallel.hpp"

namespace lattice::parallel {

// Rank `rank` of `cp`'s runs when it holds local_len = T / cp rows of each sequence (local_len
// even: two chunks of local_len / 2).
std::vector<model::PositionRun> balanced_runs(int64_t local_len, int cp, int rank);

// local [batch, T / cp] = rank `rank`'s rows of full [batch, T] (its two chunks, in row order).
void take_context_rows(int32_t* local, const int32_t* full, int64_t batch, int64_t seq_len, int cp,
                       int rank);

// Throws lattice::Error naming the fix when seq_len cannot be split over cp ranks (2·cp chunks).
void check_context_split(int64_t seq_len, int cp);

}  // namespace lattice::parallel
