// Global gradient norm: see global_norm.hpp.
#include "lattice/parallel/global_norm.hpp"

#include <algorithm>
#include <cmath>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

namespace {

int group_size(const mesh::AxisGroups& groups, mesh::Axis axis) {
  const comm::Communicator* group = groups[static_cast<size_t>(axis)];
  return group ? group->size() : 1;
}

}  // namespace

NormClasses::NormClasses(const model::ParameterStore& store, const mesh::AxisGroups& groups) {
  // The axes each parameter's sums are added over: the partition axes of more than one rank it is
  // not replicated over.
  mesh::AxisSet partition;
  for (mesh::Axis axis : mesh::kAllAxes)
    if (kModelPartitionAxes.contains(axis) && group_size(groups, axis) > 1)
      partition = partition.with(axis);
  const auto& params = store.parameters();
  std::vector<mesh::AxisSet> of_param;
  for (const auto& p : params)
    of_param.push_back(
        mesh::AxisSet::from_bits(p.replicated.complement().bits() & partition.bits()));
  // A copy of another store's parameter (a tied head on the last stage) is counted there only.
  bool copies = false;
  axes_.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].is_copy())
      copies = true;
    else
      axes_.push_back(of_param[i]);
  }
  std::sort(axes_.begin(), axes_.end(),
            [](mesh::AxisSet a, mesh::AxisSet b) { return a.bits() < b.bits(); });
  axes_.erase(std::unique(axes_.begin(), axes_.end()), axes_.end());
  if (axes_.empty()) axes_.push_back(mesh::AxisSet{});
  if (axes_.size() == 1 && !copies) return;  // one class: the plain chunked sum (no runs)
  // In buffer order (expert-parallel experts are laid out after the other parameters).
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return params[a].offset < params[b].offset; });
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t i = order[n];
    const int cls =
        params[i].is_copy()
            ? kUncounted
            : static_cast<int>(std::find(axes_.begin(), axes_.end(), of_param[i]) - axes_.begin());
    const int64_t begin = n == 0 ? 0 : params[i].offset;
    const int64_t end = n + 1 < order.size() ? params[order[n + 1]].offset : store.size();
    if (!runs_.empty() && runs_.back().cls == cls)
      runs_.back().end = end;
    else
      runs_.push_back({begin, end, cls});
  }
}

void shard_chunk_sums(kernels::Ops& ops, const Bucket& bucket, int rank, const float* data,
                      std::vector<double>& partials, const NormClasses& classes) {
  const int64_t begin = bucket.begin + bucket.shard * rank;
  const auto& runs = classes.runs();
  const size_t count = static_cast<size_t>(classes.count());
  // The pieces to sum, each with the partial it adds to: one per chunk of at most kNormChunk
  // elements (one class), or each chunk's pieces of each class (in buffer order). All are summed
  // in one call, spread over the threads; each piece's sum is the one a call of its own gives.
  std::vector<kernels::FloatRun> pieces;
  std::vector<size_t> slot;
  // The first class run that may overlap this shard.
  auto run = std::upper_bound(runs.begin(), runs.end(), begin,
                              [](int64_t at, const NormClasses::Run& r) { return at < r.end; });
  for (int64_t c = 0; c < bucket.shard; c += kNormChunk) {
    const int64_t lo = begin + c, hi = std::min(bucket.end, lo + kNormChunk);
    if (runs.empty()) {
      pieces.push_back({data + c, std::max<int64_t>(hi - lo, 0)});
      slot.push_back(partials.size());
      partials.push_back(0.0);
      continue;
    }
    const size_t first = partials.size();
    partials.resize(first + count, 0.0);
    for (; run != runs.end() && run->begin < hi; ++run) {
      const int64_t a = std::max(lo, run->begin), e = std::min(hi, run->end);
      if (a < e && run->cls != NormClasses::kUncounted) {
        pieces.push_back({data + (a - begin), e - a});
        slot.push_back(first + static_cast<size_t>(run->cls));
      }
      if (run->end > hi) break;  // continues into the next chunk
    }
  }
  std::vector<double> sums(pieces.size());
  if (!pieces.empty()) ops.sum_of_squares_each(pieces, sums.data());
  // Added in piece order: a class's pieces of one chunk in buffer order, as one call each would.
  for (size_t i = 0; i < pieces.size(); ++i) partials[slot[i]] += sums[i];
}

double norm_from_partials(const BucketLayout& layout, const std::vector<double>& dense,
                          const std::vector<double>& expert, const NormClasses& classes,
                          const mesh::AxisGroups& groups) {
  const auto count = static_cast<int64_t>(classes.count());
  // Per rank: the dense buckets' chunks, or the expert buckets'.
  const int64_t dense_chunks = layout.dense_shard_elements() / kNormChunk;
  const int64_t dense_per_rank = dense_chunks * count;
  const int64_t expert_per_rank = layout.shard_elements() / kNormChunk * count - dense_per_rank;
  check(static_cast<int64_t>(dense.size()) == dense_per_rank * layout.ranks() &&
            static_cast<int64_t>(expert.size()) ==
                (expert_per_rank > 0 ? expert_per_rank * layout.expert_ranks() : 0),
        "gradient norm: partial sums of the wrong size (internal error)");
  // Buckets by ascending position in the buffer; inside a bucket, rank order is buffer order.
  std::vector<const Bucket*> ordered;
  for (const Bucket& b : layout.buckets()) ordered.push_back(&b);
  std::sort(ordered.begin(), ordered.end(),
            [](const Bucket* a, const Bucket* b) { return a->begin < b->begin; });
  std::vector<double> totals(static_cast<size_t>(count), 0.0);
  for (const Bucket* b : ordered) {
    const std::vector<double>& partials = b->expert ? expert : dense;
    const int64_t per_rank = b->expert ? expert_per_rank : dense_per_rank;
    const int64_t chunks = b->shard / kNormChunk,
                  first = b->shard_offset / kNormChunk - (b->expert ? dense_chunks : 0);
    for (int r = 0; r < b->ranks; ++r)
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t k = 0; k < count; ++k)
          totals[static_cast<size_t>(k)] +=
              partials[static_cast<size_t>(r * per_rank + (first + c) * count + k)];
  }
  if (count == 1 && classes.axes(0).empty()) return std::sqrt(totals[0]);
  // Each class added over its axes: a fixed-size table by axis set, so that ranks whose stores
  // hold different classes (pipeline stages) still exchange the same amount.
  std::vector<double> by_axes(mesh::kAxisSetCount, 0.0);
  for (int64_t k = 0; k < count; ++k)
    by_axes[classes.axes(static_cast<int>(k)).bits()] = totals[static_cast<size_t>(k)];
  for (mesh::Axis axis : mesh::kAllAxes) {
    comm::Communicator* group = groups[static_cast<size_t>(axis)];
    if (!kModelPartitionAxes.contains(axis) || group == nullptr || group->size() == 1) continue;
    std::vector<double> gathered(by_axes.size() * static_cast<size_t>(group->size()));
    // The doubles travel as 64-bit integers: an all-gather only moves bits.
    group->all_gather(by_axes.data(), gathered.data(), static_cast<int64_t>(by_axes.size()),
                      DType::i64);
    for (uint32_t set = 0; set < mesh::kAxisSetCount; ++set) {
      if (!mesh::AxisSet::from_bits(set).contains(axis)) continue;
      double sum = 0.0;
      for (int r = 0; r < group->size(); ++r)
        sum += gathered[static_cast<size_t>(r) * by_axes.size() + set];
      by_axes[set] = sum;
    }
  }
  double total = 0.0;
  for (double t : by_axes) total += t;
  return std::sqrt(total);
}

double replicated_gradient_norm(kernels::Ops& ops, const BucketLayout& layout, const float* grads,
                                const NormClasses& classes, const mesh::AxisGroups& groups) {
  // Every rank's partial sums of each group, as the ranks would compute them.
  std::vector<double> by_group[2];
  for (bool expert : {false, true}) {
    const int ranks = expert ? layout.expert_ranks() : layout.ranks();
    for (int r = 0; r < ranks; ++r)
      for (const Bucket& b : layout.buckets())
        if (b.expert == expert)
          shard_chunk_sums(ops, b, r, grads + b.shard_begin(r), by_group[expert], classes);
  }
  return norm_from_partials(layout, by_group[0], by_group[1], classes, groups);
}

double sharded_gradient_norm(kernels::Ops& ops, const BucketLayout& layout,
                             const float* shard_grads, comm::Communicator& group,
                             const NormClasses& classes, const mesh::AxisGroups& groups,
                             comm::Communicator* expert_group) {
  std::vector<double> by_group[2];
  for (bool expert : {false, true}) {
    const bool any = std::any_of(layout.buckets().begin(), layout.buckets().end(),
                                 [&](const Bucket& b) { return b.expert == expert; });
    if (!any) continue;
    comm::Communicator* over = expert ? expert_group : &group;
    check(over != nullptr,
          "gradient norm: expert buckets without an expert group (internal error)");
    std::vector<double> mine;
    for (const Bucket& b : layout.buckets())
      if (b.expert == expert)
        shard_chunk_sums(ops, b, over->rank(), shard_grads + b.shard_offset, mine, classes);
    by_group[expert].resize(mine.size() * static_cast<size_t>(over->size()));
    // The doubles travel as 64-bit integers: an all-gather only moves bits.
    over->all_gather(mine.data(), by_group[expert].data(), static_cast<int64_t>(mine.size()),
                     DType::i64);
  }
  return norm_from_partials(layout, by_group[0], by_group[1], classes, groups);
}

}  // namespace lattice::parallel
