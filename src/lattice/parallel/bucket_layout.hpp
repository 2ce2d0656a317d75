// BucketLayout: how data parallelism cuts the flat gradient (and parameter) buffer. Buckets are
// runs of whole parameter units (embedding, blocks, head) taken in backward order until a bucket
// holds at least `bucket_elements` (the embedding and the head, which ZeRO-3 keeps whole, always
// get buckets of their own); each bucket is padded so that it splits into `ranks` equal
// shards of a multiple of kNormChunk elements, and rank r owns shard r of every bucket. Plain DP
// and ZeRO-1/2/3 use this one layout, so their reductions run the same collectives on the same
// data and agree bit for bit. Bucket boundaries do not depend on the rank count, so neither does
// the gradient norm's chunking (see global_norm.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/model/transformer.hpp"

namespace lattice::parallel {

// Granularity of the gradient norm's partial sums and of shard sizes (elements; 4 KiB of fp32).
inline constexpr int64_t kNormChunk = 1024;

struct Bucket {
  int64_t begin = 0, end = 0;         // element range of the flat buffers
  int first_unit = 0, last_unit = 0;  // units [first_unit, last_unit] (forward order)
  int64_t shard = 0;                  // elements per rank (a multiple of kNormChunk)
  int64_t shard_offset = 0;           // where this bucket's shard starts in a rank's shard buffers
  bool outer = false;                 // holds the embedding or the head

  int64_t size() const { return end - begin; }
  // The part of shard `rank` that holds real elements: [begin, end) of the flat buffer.
  int64_t shard_begin(int rank) const;
  int64_t shard_end(int rank) const;
};

class BucketLayout {
 public:
  // Throws Error when bucket_elements is not positive or ranks < 1.
  BucketLayout(const std::vector<model::ParameterUnit>& units, int64_t bucket_elements, int ranks);

  int ranks() const { return ranks_; }
  // Buckets in backward order: buckets()[0] holds the head and is reduced first.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The bucket holding unit `unit`.
  int bucket_of_unit(int unit) const { return bucket_of_unit_.at(static_cast<size_t>(unit)); }
  // Elements of one rank's shard buffers (sum of the buckets' shard sizes).
  int64_t shard_elements() const { return shard_elements_; }
  // Elements of the whole flat buffer covered (the store size).
  int64_t total_elements() const { return total_; }

 private:
  int ranks_;
  int64_t total_ = 0, shard_elements_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
};

}  // namespace lattice::parallel
