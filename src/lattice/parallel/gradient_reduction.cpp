// GradientReduction: see gradient_reduction.hpp.
#include "lattice/parallel/gradient_reduction.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

// What is in flight for one bucket.
struct GradientReduction::BucketState {
  Tensor grad_staging;  // N·shard: the pre-scaled local gradients being reduced
  Tensor reduced;       // stage 0: this rank's reduced shard, gathered into the gradients
  std::vector<int64_t> gather_counts;  // stage 0: each rank's real elements of the bucket's shard
  comm::CommHandle reduction;
  bool reducing = false;
  bool grads_resident = true;  // stages 2-3: the model's gradient pages hold this bucket
  bool held = false;           // reduced by finish() only
};

GradientReduction::GradientReduction(kernels::Ops& ops, model::ParameterStore& store,
                                     const BucketLayout& layout, int zero_stage,
                                     const DataParallelGroups& groups, MemoryTracker* tracker,
                                     CommunicationClock& clock)
    : store_(store),
      layout_(layout),
      zero_stage_(zero_stage),
      groups_(groups),
      tracker_(tracker),
      clock_(clock),
      ops_(ops),
      norm_classes_(store, groups.axes) {
  // Placements: data parallelism averages only what every batch rank holds alike.
  for (const auto& p : store.parameters())
    for (mesh::Axis axis : {mesh::Axis::dp, mesh::Axis::cp})
      check(p.replicated.contains(axis),
            "data parallelism: parameter '" + p.name + "' is not replicated over " +
                std::string(mesh::axis_name(axis)) +
                ", so its gradient cannot be averaged over the batch ranks (internal error: "
                "such parameters need their own reduction group)");
  for (size_t b = 0; b < layout_.buckets().size(); ++b)
    state_.push_back(std::make_unique<BucketState>());
  // Expert parameters (held along ep alone) sit in expert buckets, reduced over the ranks holding
  // the same experts (each already holds every ep rank's tokens' part).
  for (const auto& p : store.parameters()) {
    if (p.replicated.contains(mesh::Axis::ep)) continue;
    const bool in_expert_bucket =
        std::any_of(layout_.buckets().begin(), layout_.buckets().end(), [&](const Bucket& b) {
          return b.expert && p.offset >= b.begin && p.offset + p.numel <= b.end;
        });
    check(groups.expert != nullptr && in_expert_bucket,
          "parameter '" + p.name +
              "' is held along the expert-parallel axis, but data parallelism has no "
              "expert-data-parallel group or expert bucket for it (internal error)");
  }
  if (zero_stage_ >= 1)
    shard_grads_ = Tensor({layout_.shard_elements()}, DType::f32, ops_.memory(), tracker,
                          MemoryCategory::gradients);
}

GradientReduction::~GradientReduction() {
  for (size_t b = 0; b < state_.size(); ++b) {
    BucketState& s = *state_[b];
    try {
      s.reduction.wait();
    } catch (...) {
    }
    const int64_t bytes = layout_.buckets()[b].size() * int64_t{sizeof(float)};
    if (tracker_ && !s.grads_resident) tracker_->add(MemoryCategory::gradients, bytes);
  }
}

void GradientReduction::begin_micro_batch(bool first, bool last) {
  last_micro_ = last;
  // Stages 2-3 leave the gradient pages released (zero) after each reduction; 0-1 zero them here.
  if (first && zero_stage_ <= 1) store_.zero_grads();
}

void GradientReduction::before_backward(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (tracker_ && !s.grads_resident)
    tracker_->add(MemoryCategory::gradients,
                  layout_.buckets()[static_cast<size_t>(b)].size() * int64_t{sizeof(float)});
  s.grads_resident = true;
}

void GradientReduction::hold(int b) {
  state_.at(static_cast<size_t>(b))->held = true;
}

void GradientReduction::after_backward(int b) {
  if (last_micro_) launch(b);
}

void GradientReduction::launch(int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (s.reducing || (s.held && !finishing_)) return;
  // Expert buckets are reduced and sharded over the ranks holding the same experts.
  comm::Communicator& shard = bucket.expert ? *groups_.expert : *groups_.shard;
  if (zero_stage_ == 0 && shard.size() == 1 && groups_.batch->size() == 1 && !groups_.replicate) {
    // One rank holding the whole batch: the gradients already are the reduction's result (scaled
    // by 1), where the staging copy, the reduce-scatter and the gather back would pass over them
    // three times (3.4% of the small bench shape's bf16 step).
    s.reduction = comm::CommHandle();
    s.reducing = true;
    return;
  }
  const int64_t padded = bucket.shard * shard.size();
  // Stage 0 keeps its reduction buffers from step to step (as DDP keeps its buckets): allocating
  // them anew each step cost a zeroing pass and, for blocks of 2 MiB and more, fresh page faults.
  // Stages 1-3 free them after each reduction (their point is memory). The padding past the
  // bucket's end is zero from allocation and nothing writes it.
  if (zero_stage_ != 0 || s.grad_staging.numel() != padded)
    s.grad_staging = Tensor({padded}, DType::f32, ops_.memory(), tracker_, MemoryCategory::other);
  // Averaging: every rank scales by 1/N before the sum (exact for powers of two). N is the batch
  // group's size for the experts too: their sum over the expert group is the batch's sum.
  const float scale = 1.0f / static_cast<float>(groups_.batch->size());
  float* grads = store_.grads() + bucket.begin;
  float* staging = s.grad_staging.f32();
  ops_.scale_copy(staging, grads, bucket.size(), scale);
  if (zero_stage_ >= 2) {
    ops_.memory().release(grads, static_cast<size_t>(bucket.size()) * sizeof(float));
    if (tracker_ && s.grads_resident)
      tracker_->remove(MemoryCategory::gradients, bucket.size() * int64_t{sizeof(float)});
    s.grads_resident = false;
  }
  if (zero_stage_ == 0) {
    if (s.reduced.numel() != bucket.shard)
      s.reduced =
          Tensor({bucket.shard}, DType::f32, ops_.memory(), tracker_, MemoryCategory::other);
    shard.reduce_scatter_async(staging, s.reduced.f32(), bucket.shard, DType::f32,
                               comm::ReduceOp::sum);
    // The reduced shards are gathered straight into the gradients (no copy back from staging):
    // each rank contributes the real elements of its shard, the padding past the bucket's end
    // stays behind.
    if (s.gather_counts.empty()) {
      for (int r = 0; r < shard.size(); ++r)
        s.gather_counts.push_back(bucket.shard_end(r) - bucket.shard_begin(r));
    }
    s.reduction = shard.all_gather_v_async(s.reduced.f32(), grads, s.gather_counts, DType::f32);
  } else {
    s.reduction = shard.reduce_scatter_async(staging, shard_grads_.f32() + bucket.shard_offset,
                                             bucket.shard, DType::f32, comm::ReduceOp::sum);
  }
  s.reducing = true;
}

double GradientReduction::finish() {
  finishing_ = true;
  for (size_t b = 0; b < state_.size(); ++b) launch(static_cast<int>(b));
  finishing_ = false;
  for (size_t b = 0; b < state_.size(); ++b) {
    BucketState& s = *state_[b];
    clock_.wait(s.reduction);
    s.reducing = false;
    if (zero_stage_ != 0) s.grad_staging.reset();  // stage 0 keeps it for the next step
    // HSDP: the groups' shards are summed across the replicas (the experts' shard group is already
    // every rank holding them).
    if (groups_.replicate && !layout_.buckets()[b].expert)
      s.reduction = groups_.replicate->allreduce_async(
          shard_grads_.f32() + layout_.buckets()[b].shard_offset, layout_.buckets()[b].shard,
          DType::f32, comm::ReduceOp::sum);
  }
  if (groups_.replicate)
    for (size_t b = 0; b < state_.size(); ++b)
      if (!layout_.buckets()[b].expert) clock_.wait(state_[b]->reduction);
  if (exchange_)  // between replica groups: host memory, this rank's part as it holds it
    exchange_(zero_stage_ == 0 ? store_.grads() : shard_grads_.f32(), held_elements());
  if (zero_stage_ == 0)
    return replicated_gradient_norm(ops_, layout_, store_.grads(), norm_classes_, groups_.axes);
  const auto start = CommunicationClock::Clock::now();
  const double norm = sharded_gradient_norm(ops_, layout_, shard_grads_.f32(), *groups_.shard,
                                            norm_classes_, groups_.axes, groups_.expert);
  clock_.add_since(start);
  return norm;
}

int64_t GradientReduction::held_elements() const {
  return zero_stage_ == 0 ? layout_.total_elements() : layout_.shard_elements();
}

}  // namespace lattice::parallel
