// BucketLayout: how data parallelism cuts the flat gradient (and parameter) buffer. Buckets are
// runs of whole parameter units (embedding, blocks, head) taken in backward order until a bucket
// holds at least `bucket_elements` (the embedding and the head, which ZeRO-3 keeps whole, always
// get buckets of their own); each bucket is padded so that it splits into `ranks` equal
// shards of a multiple of kNormChunk elements, and rank r owns shard r of every bucket. Plain DP
// and ZeRO-1/2/3 use this one layout, so their reductions run the same collectives on the same
// data and agree bit for bit. Bucket boundaries do not depend on the rank count, so neither does
// the gradient norm's chunking (see global_norm.hpp).
//
// Expert parallelism: the units' expert ranges (a MoE block's experts, laid out after every other
// parameter; model::ParameterUnit) get buckets of their own, built the same way after the dense
// ones and split into `expert_ranks` shards: the ranks holding the same experts (the
// expert-data-parallel group) reduce and shard them, while the dense buckets go over the shard
// group. A unit may then be in two buckets, a dense and an expert one.
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
  bool expert = false;                // holds expert-parallel experts (the expert shard group's)
  int ranks = 1;                      // the shards it splits into

  int64_t size() const { return end - begin; }
  // The part of shard `rank` that holds real elements: [begin, end) of the flat buffer.
  int64_t shard_begin(int rank) const;
  int64_t shard_end(int rank) const;
};

class BucketLayout {
 public:
  // Throws Error when bucket_elements is not positive or ranks < 1.
  BucketLayout(const std::vector<model::ParameterUnit>& units, int64_t bucket_elements, int ranks,
               int expert_ranks = 1);

  int ranks() const { return ranks_; }
  int expert_ranks() const { return expert_ranks_; }
  // The dense buckets in backward order (buckets()[0] holds the head and is reduced first), then
  // the expert buckets in backward order.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The dense bucket holding unit `unit`, and the expert bucket holding its experts (-1: none).
  int bucket_of_unit(int unit) const { return bucket_of_unit_.at(static_cast<size_t>(unit)); }
  int expert_bucket_of_unit(int unit) const {
    return expert_bucket_of_unit_.at(static_cast<size_t>(unit));
  }
  // Both: the unit's dense bucket, then its expert bucket when it has experts.
  std::vector<int> buckets_of_unit(int unit) const;
  // Elements of one rank's shard buffers (sum of the buckets' shard sizes): the dense buckets'
  // shards first (dense_shard_elements() of them), then the expert buckets'.
  int64_t shard_elements() const { return shard_elements_; }
  int64_t dense_shard_elements() const { return dense_shard_elements_; }
  // Elements of the whole flat buffer covered (the store size).
  int64_t total_elements() const { return total_; }

 private:
  // Buckets over the ranges `range_of(unit)` (empty ranges skipped), `ranks` shards each.
  template <typename RangeOf>
  void add_buckets(const std::vector<model::ParameterUnit>& units, int64_t bucket_elements,
                   int ranks, bool expert, RangeOf range_of, std::vector<int>& bucket_of_unit);

  int ranks_, expert_ranks_;
  int64_t total_ = 0, shard_elements_ = 0, dense_shard_elements_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_, expert_bucket_of_unit_;
};

}  // namespace lattice::parallel
