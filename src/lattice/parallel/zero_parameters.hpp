// ZeroParameters: ZeRO's parameter sharding, the gathers and releases of the model's parameter
// buckets, and the model hooks that drive them.
//   stages 1-2: every rank holds the whole model; after the optimizer updates this rank's shards,
//            each bucket's shards are all-gathered over the shard group, waited for just before
//            the bucket's first forward use (overlapping the next step's forward);
//   stage 3: the master copy of this rank's parameter shards lives here (the embedding and head,
//            kept whole, excepted): a bucket's parameters are gathered before its forward and
//            again before its backward, the next bucket is prefetched, and the pages are released
//            after use (DeviceMemory::release).
// Expert buckets (expert parallelism) are sharded and gathered over the expert-data-parallel group,
// the dense ones over the shard group; a unit's hooks drive both of its buckets.
#pragma once

#include <memory>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/communication_clock.hpp"

namespace lattice::parallel {

class ZeroParameters final : public model::ModelHooks {
 public:
  // Stage 3 copies this rank's shards out of the (whole, initialised) store and releases the rest.
  // `expert_group`: the expert buckets' group (null: no expert buckets).
  // The shards' copies run on `ops`, whose memory the shards and gather buffers come from.
  ZeroParameters(kernels::Ops& ops, model::ParameterStore& store, const BucketLayout& layout,
                 int zero_stage, comm::Communicator& shard_group, comm::Communicator* expert_group,
                 MemoryTracker* tracker, CommunicationClock& clock);
  // Waits for what is in flight and gives the tracker back the released parameter bytes.
  ~ZeroParameters() override;
  ZeroParameters(const ZeroParameters&) = delete;
  ZeroParameters& operator=(const ZeroParameters&) = delete;

  // Where this rank's shard of `bucket`'s values lives (for the optimizer to update): the stage-3
  // master copy, else the model's own values.
  float* shard_values(const Bucket& bucket);
  // Stage 3: this rank's parameter shards, contiguous (layout.shard_elements()); null otherwise.
  float* master_shards() { return shard_params_.empty() ? nullptr : shard_params_.f32(); }
  // After an update of the shards: starts the gathers (stages 1-2 every bucket; stage 3 the
  // whole-kept embedding and head), finished by the next forward or by settle().
  void gather_updated();
  // Completes pending gathers, and with `full` gathers every ZeRO-3 bucket (the model then holds
  // every parameter until the next forward releases them).
  void settle(bool full);
  // Stage 3, after the store's values were loaded whole: keeps this rank's shards, releases the
  // rest.
  void take_whole_values();
  // Whether the model's pages hold bucket `b`'s parameters now.
  bool resident(int b) const;

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  struct BucketState;
  void start_gather(int b);
  void finish_gather(int b);
  void release(int b);
  // The group bucket `bucket` is sharded over, and this rank's shard of it.
  comm::Communicator& group_of(const Bucket& bucket) const;
  int rank_in(const Bucket& bucket) const { return group_of(bucket).rank(); }
  // Hooks for one bucket of `unit`.
  void before_forward(int unit, int b);
  void after_forward(int unit, int b);
  void before_backward(int unit, int b);
  void after_backward(int unit, int b);

  kernels::Ops& ops_;
  model::ParameterStore& store_;
  const BucketLayout& layout_;
  int zero_stage_;
  comm::Communicator& shard_;
  comm::Communicator* expert_;
  MemoryTracker* tracker_;
  CommunicationClock& clock_;
  std::vector<std::unique_ptr<BucketState>> state_;
  Tensor shard_params_;  // stage 3: this rank's parameter shards (the master copy)
};

}  // namespace lattice::parallel
