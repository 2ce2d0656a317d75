// The global gradient norm under any data-parallel layout: the flat gradient is cut into fixed
// chunks of kNormChunk elements counted from each bucket's start (bucket boundaries do not depend
// on the rank count); each chunk's sum of squares is computed in double by the deterministic
// kernel, by whichever rank holds that chunk's reduced gradient, and the partials are added in
// ascending buffer order on every rank. Each logical parameter is counted once and the result is
// bit-identical for every ZeRO stage and rank count (given the same reduced gradients), and to one
// rank.
//
// Placements (model::ParameterInfo): a parameter that is not replicated over a model-partition
// axis (tp, pp, ep: a tensor-parallel slice, another stage's weights) holds different elements on
// the ranks of that axis, so its sum of squares is added over the axis' group; a replicated one is
// taken once. The elements are grouped in classes by the set of axes they are added over
// (NormClasses); each class is summed as above, then over its axes (one all-gather of a few
// doubles per axis of more than one rank), and the classes are added in a fixed order. With one
// class (every parameter replicated, as in any run without tensor or pipeline parallelism) the
// arithmetic is exactly the one-class sum above. The batch axes (dp, cp and dp's sub-axes) are
// data parallelism's own: its reduction and ZeRO's shards (the buckets) account for them.
#pragma once

#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/bucket_layout.hpp"

namespace lattice::parallel {

// The axes whose groups the norm adds over (a parameter's axes beyond these are data
// parallelism's).
inline constexpr mesh::AxisSet kModelPartitionAxes = {mesh::Axis::tp, mesh::Axis::pp,
                                                      mesh::Axis::ep};

// Which class each element of the flat buffer belongs to: the model-partition axes (of more than
// one rank) its parameter is not replicated over; a copy of another store's parameter
// (ParameterInfo::is_copy) belongs to none and is not counted. A default NormClasses is one class
// added over no axis.
class NormClasses {
 public:
  NormClasses() = default;
  // From the placements of `store`'s parameters; `groups` gives each axis' size (null: 1). A
  // parameter's class covers its elements and the alignment padding after them.
  NormClasses(const model::ParameterStore& store, const mesh::AxisGroups& groups);

  int count() const { return static_cast<int>(axes_.size()); }
  // The axes class `k` is added over.
  mesh::AxisSet axes(int k) const { return axes_.at(static_cast<size_t>(k)); }

  // The class of the elements the norm does not count (copies of another store's parameter).
  static constexpr int kUncounted = -1;
  // Consecutive element ranges of one class (or kUncounted), covering the store in buffer order.
  struct Run {
    int64_t begin = 0, end = 0;
    int cls = 0;
  };
  const std::vector<Run>& runs() const { return runs_; }

 private:
  std::vector<mesh::AxisSet> axes_ = {mesh::AxisSet{}};  // by class, ascending bits
  std::vector<Run> runs_;                                // empty with one class
};

// Sum of squares of each chunk of `bucket`'s shard `rank` (kNormChunk-element chunks; chunks past
// the bucket's end give 0), one value per class per chunk: classes.count() x shard / kNormChunk
// values appended to `partials` (chunk-major). `data` points at the shard's first element
// (flat-buffer element bucket.begin + bucket.shard x rank).
void shard_chunk_sums(kernels::Ops& ops, const Bucket& bucket, int rank, const float* data,
                      std::vector<double>& partials, const NormClasses& classes = {});

// L2 norm from every rank's chunk sums: `dense` holds, for each rank of the dense buckets' group
// in order, that rank's shard_chunk_sums over the dense buckets in layout order; `expert` the same
// over the expert buckets for each rank of the expert group (empty without expert buckets). Adds
// them in ascending buffer order, then each class over its axes' groups (collective over those
// groups), then the classes.
double norm_from_partials(const BucketLayout& layout, const std::vector<double>& dense,
                          const std::vector<double>& expert, const NormClasses& classes = {},
                          const mesh::AxisGroups& groups = {});

// The norm when this rank holds the whole reduced gradient `grads` (plain DP, one rank).
double replicated_gradient_norm(kernels::Ops& ops, const BucketLayout& layout, const float* grads,
                                const NormClasses& classes = {},
                                const mesh::AxisGroups& groups = {});

// The norm when each rank holds only its shards' reduced gradients: `shard_grads` is this rank's
// shard buffer (layout.shard_elements()). Collective over `group` (the dense buckets' shard group;
// one all-gather of doubles), over `expert_group` (the expert buckets', when there are any) and
// over the groups the classes are added over.
double sharded_gradient_norm(kernels::Ops& ops, const BucketLayout& layout,
                             const float* shard_grads, comm::Communicator& group,
                             const NormClasses& classes = {}, const mesh::AxisGroups& groups = {},
                             comm::Communicator* expert_group = nullptr);

}  // namespace lattice::parallel
