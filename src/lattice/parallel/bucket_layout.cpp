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
                           int ranks, int expert_ranks)
    : ranks_(ranks), expert_ranks_(expert_ranks) {
  check(bucket_elements > 0, "parallelism.bucket_mb must be positive (try 25)");
  check(ranks >= 1 && expert_ranks >= 1, "data parallelism needs at least one rank");
  check(!units.empty(), "the model has no parameters to train");
  bucket_of_unit_.assign(units.size(), -1);
  expert_bucket_of_unit_.assign(units.size(), -1);
  total_ = units.back().end;
  add_buckets(
      units, bucket_elements, ranks, false,
      [](const model::ParameterUnit& u) {
        return std::pair{u.begin, u.end};
      },
      bucket_of_unit_);
  dense_shard_elements_ = shard_elements_;
  for (const model::ParameterUnit& u : units)
    if (u.has_experts()) total_ = std::max(total_, u.expert_end);
  add_buckets(
      units, bucket_elements, expert_ranks, true,
      [](const model::ParameterUnit& u) {
        return std::pair{u.expert_begin, u.expert_end};
      },
      expert_bucket_of_unit_);
}

std::vector<int> BucketLayout::buckets_of_unit(int unit) const {
  std::vector<int> buckets{bucket_of_unit(unit)};
  if (expert_bucket_of_unit(unit) >= 0) buckets.push_back(expert_bucket_of_unit(unit));
  return buckets;
}

template <typename RangeOf>
void BucketLayout::add_buckets(const std::vector<model::ParameterUnit>& units,
                               int64_t bucket_elements, int ranks, bool expert, RangeOf range_of,
                               std::vector<int>& bucket_of_unit) {
  // The units in these buckets (every unit is in a dense one; expert buckets hold the units with
  // experts), walked from the last (backward order), closing a bucket once it is large enough.
  std::vector<int> members;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const auto [begin, end] = range_of(units[static_cast<size_t>(u)]);
    if (!expert || end > begin) members.push_back(u);
  }
  int last = static_cast<int>(members.size()) - 1;
  for (int m = last; m >= 0; --m) {
    const auto unit = [&](int i) -> const model::ParameterUnit& {
      return units[static_cast<size_t>(members[static_cast<size_t>(i)])];
    };
    const int64_t size = range_of(unit(last)).second - range_of(unit(m)).first;
    // The embedding and head (outer units, kept whole by ZeRO-3) never share a bucket with blocks.
    const bool boundary = m == 0 || unit(m - 1).outer != unit(m).outer;
    if (size < bucket_elements && !boundary) continue;
    Bucket b;
    b.first_unit = members[static_cast<size_t>(m)];
    b.last_unit = members[static_cast<size_t>(last)];
    b.begin = range_of(unit(m)).first;
    b.end = range_of(unit(last)).second;
    b.expert = expert;
    b.ranks = ranks;
    for (int i = m; i <= last; ++i) {
      b.outer = b.outer || unit(i).outer;
      bucket_of_unit[static_cast<size_t>(members[static_cast<size_t>(i)])] =
          static_cast<int>(buckets_.size());
    }
    const int64_t per_rank = (b.size() + ranks - 1) / ranks;
    b.shard = std::max<int64_t>(1, (per_rank + kNormChunk - 1) / kNormChunk) * kNormChunk;
    b.shard_offset = shard_elements_;
    shard_elements_ += b.shard;
    buckets_.push_back(b);
    last = m - 1;
  }
}

}  // namespace lattice::parallel
