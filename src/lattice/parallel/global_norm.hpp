// The global gradient norm under any data-parallel layout: the flat gradient is cut into fixed
// chunks of kNormChunk elements counted from each bucket's start (bucket boundaries do not depend
// on the rank count); each chunk's sum of squares is computed in double by the deterministic
// kernel, by whichever rank holds that chunk's reduced gradient, and the partials are added in
// ascending buffer order on every rank. Each logical parameter is counted once and the result is
// bit-identical for every ZeRO stage and rank count (given the same reduced gradients), and to one
// rank.
#pragma once

#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/parallel/bucket_layout.hpp"

namespace lattice::parallel {

// Sum of squares of each chunk of `bucket`'s shard `rank` (kNormChunk-element chunks; chunks past
// the bucket's end give 0): shard / kNormChunk values appended to `partials`. `data` points at the
// shard's first element (flat-buffer element shard_begin(rank)).
void shard_chunk_sums(const Bucket& bucket, int rank, const float* data,
                      std::vector<double>& partials);

// L2 norm from every rank's chunk sums: `all_partials` holds, for each rank in order, that rank's
// shard_chunk_sums over the buckets in layout order. Adds them in ascending buffer order.
double norm_from_partials(const BucketLayout& layout, const std::vector<double>& all_partials);

// The norm when this rank holds the whole reduced gradient `grads` (plain DP, one rank).
double replicated_gradient_norm(const BucketLayout& layout, const float* grads);

// The norm when each rank holds only its shards' reduced gradients: `shard_grads` is this rank's
// shard buffer (layout.shard_elements()). Collective over `group` (one all-gather of doubles).
double sharded_gradient_norm(const BucketLayout& layout, const float* shard_grads,
                             comm::Communicator& group);

}  // namespace lattice::parallel
