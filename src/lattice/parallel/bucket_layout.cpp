// BucketLayout: see bucket_layout.hpp.
#include "lattice/parallel/bucket_layout.hpp"

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

int64_t Bucket::shard_begin(int rank) const {
  return std::min(end, begin + shard * rank);
}

int64_t Bucket::shard_end(int rank) const {
  return std::min(end, begin + shard * (rank + 1));
}

BucketLayout::BucketLayout(const std::vector<model::ParameterUnit>& units, int64_t bucket_elements,
                           int ranks)
    : ranks_(ranks) {
  check(bucket_elements > 0, "parallelism.bucket_mb must be positive (try 25)");
  check(ranks >= 1, "data parallelism needs at least one rank");
  check(!units.empty(), "the model has no parameters to train");
  bucket_of_unit_.assign(units.size(), -1);
  total_ = units.back().end;
  // Walk the units from the last (backward order), closing a bucket once it is large enough.
  int last = static_cast<int>(units.size()) - 1;
  for (int u = last; u >= 0; --u) {
    const int64_t size = units[static_cast<size_t>(last)].end - units[static_cast<size_t>(u)].begin;
    // The embedding and head (outer units, kept whole by ZeRO-3) never share a bucket with blocks.
    const bool boundary =
        u == 0 || units[static_cast<size_t>(u - 1)].outer != units[static_cast<size_t>(u)].outer;
    if (size < bucket_elements && !boundary) continue;
    Bucket b;
    b.first_unit = u;
    b.last_unit = last;
    b.begin = units[static_cast<size_t>(u)].begin;
    b.end = units[static_cast<size_t>(last)].end;
    for (int i = u; i <= last; ++i) {
      b.outer = b.outer || units[static_cast<size_t>(i)].outer;
      bucket_of_unit_[static_cast<size_t>(i)] = static_cast<int>(buckets_.size());
    }
    const int64_t per_rank = (b.size() + ranks - 1) / ranks;
    b.shard = std::max<int64_t>(1, (per_rank + kNormChunk - 1) / kNormChunk) * kNormChunk;
    b.shard_offset = shard_elements_;
    shard_elements_ += b.shard;
    buckets_.push_back(b);
    last = u - 1;
  }
}

}  // namespace lattice::parallel
