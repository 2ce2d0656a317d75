// Global gradient norm: see global_norm.hpp.
#include "lattice/parallel/global_norm.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/reduce.hpp"

namespace lattice::parallel {

void shard_chunk_sums(const Bucket& bucket, int rank, const float* data,
                      std::vector<double>& partials) {
  const int64_t begin = bucket.begin + bucket.shard * rank;
  for (int64_t c = 0; c < bucket.shard; c += kNormChunk) {
    const int64_t lo = begin + c, hi = std::min(bucket.end, lo + kNormChunk);
    // One chunk of at most kNormChunk elements: the kernel sums it in one pass, thread-independent.
    partials.push_back(hi > lo ? kernels::sum_of_squares(data + c, hi - lo) : 0.0);
  }
}

double norm_from_partials(const BucketLayout& layout, const std::vector<double>& all_partials) {
  const int ranks = layout.ranks();
  const int64_t per_rank = layout.shard_elements() / kNormChunk;
  check(static_cast<int64_t>(all_partials.size()) == per_rank * ranks,
        "gradient norm: partial sums of the wrong size (internal error)");
  // Buckets by ascending position in the buffer; inside a bucket, rank order is buffer order.
  std::vector<const Bucket*> ordered;
  for (const Bucket& b : layout.buckets()) ordered.push_back(&b);
  std::sort(ordered.begin(), ordered.end(),
            [](const Bucket* a, const Bucket* b) { return a->begin < b->begin; });
  double total = 0.0;
  for (const Bucket* b : ordered) {
    const int64_t chunks = b->shard / kNormChunk, first = b->shard_offset / kNormChunk;
    for (int r = 0; r < ranks; ++r)
      for (int64_t c = 0; c < chunks; ++c)
        total += all_partials[static_cast<size_t>(r * per_rank + first + c)];
  }
  return std::sqrt(total);
}

double replicated_gradient_norm(const BucketLayout& layout, const float* grads) {
  const int ranks = layout.ranks();
  const int64_t per_rank = layout.shard_elements() / kNormChunk;
  std::vector<double> all(static_cast<size_t>(per_rank * ranks));
  std::vector<double> one;
  for (int r = 0; r < ranks; ++r) {
    one.clear();
    for (const Bucket& b : layout.buckets()) shard_chunk_sums(b, r, grads + b.shard_begin(r), one);
    std::copy(one.begin(), one.end(), all.begin() + r * per_rank);
  }
  return norm_from_partials(layout, all);
}

double sharded_gradient_norm(const BucketLayout& layout, const float* shard_grads,
                             comm::Communicator& group) {
  const int64_t per_rank = layout.shard_elements() / kNormChunk;
  std::vector<double> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (const Bucket& b : layout.buckets())
    shard_chunk_sums(b, group.rank(), shard_grads + b.shard_offset, mine);
  std::vector<double> all(static_cast<size_t>(per_rank * layout.ranks()));
  // The doubles travel as 64-bit integers: an all-gather only moves bits.
  group.all_gather(mine.data(), all.data(), per_rank, DType::i64);
  return norm_from_partials(layout, all);
}

}  // namespace lattice::parallel
