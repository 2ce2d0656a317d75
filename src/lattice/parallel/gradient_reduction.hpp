// GradientReduction: data parallelism's gradient buckets and their reduction. When a bucket's last
// gradient is final during the last micro-batch's backward, its gradients (pre-scaled by 1/N over
// the N batch ranks) are reduce-scattered asynchronously over the shard group into this rank's
// shard while backward goes on:
//   stage 0 (plain DP): each rank's reduced shard is all-gathered straight back into the model's
//            gradients (an allreduce made of the same reduce-scatter, so every stage agrees);
//   stages 1-3: the reduced shard stays in this rank's shard buffer; stages 2-3 release the
//            bucket's local gradient pages once handed to the reduction.
// HSDP (a dp_replicate axis of more than one rank): the shards are then allreduced across the
// replicas. Expert parallelism: the expert buckets (bucket_layout.hpp) go the same way over the
// expert-data-parallel group instead (every rank holding the same experts; no replica step), still
// pre-scaled by the batch group's 1/N. The global gradient norm is computed from the reduced
// gradients (global_norm.hpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/communication_clock.hpp"
#include "lattice/parallel/global_norm.hpp"

namespace lattice::parallel {

// The communicators data parallelism runs over, all taken from the mesh.
struct DataParallelGroups {
  comm::Communicator* batch = nullptr;      // every rank that sees other data (dp x cp)
  comm::Communicator* shard = nullptr;      // the ranks that shard the state (dp_shard x cp)
  comm::Communicator* replicate = nullptr;  // HSDP: the replicas of this shard (null: none)
  // Expert parallelism: the ranks holding this rank's experts (mesh.expert_data_parallel()),
  // which reduce and shard the expert buckets (null: no expert parallelism).
  comm::Communicator* expert = nullptr;
  mesh::AxisGroups axes{};  // every mesh axis (the norm's partition axes)
};

class GradientReduction {
 public:
  GradientReduction(kernels::Ops& ops, model::ParameterStore& store, const BucketLayout& layout,
                    int zero_stage, const DataParallelGroups& groups, MemoryTracker* tracker,
                    CommunicationClock& clock);
  // Waits for what is in flight and gives the tracker back the released gradient bytes.
  ~GradientReduction();
  GradientReduction(const GradientReduction&) = delete;
  GradientReduction& operator=(const GradientReduction&) = delete;

  // Before each micro-batch's forward; `last` marks the micro-batch whose backward reduces.
  void begin_micro_batch(bool first, bool last);
  // The backward is about to write bucket `b`'s gradient pages again.
  void before_backward(int b);
  // Every gradient of bucket `b` is final (on the last micro-batch: start its reduction).
  void after_backward(int b);
  // Bucket `b` is reduced by finish() only, not during backward: its gradients are completed after
  // the backward (a tied weight's, summed across pipeline stages first).
  void hold(int b);
  // Starts every reduction not yet started, waits for all (and the HSDP allreduce) and returns the
  // global gradient norm of the reduced gradients (the same on every rank).
  double finish();

  // Stages 1-3: this rank's reduced gradient shards (layout.shard_elements()).
  const float* shard_gradients() const { return shard_grads_.f32(); }

  // What this rank holds of the reduced gradients after finish()'s reductions: the whole store's
  // gradients (stage 0) or its shards (stages 1-3), `elements` floats. Synchronous replica groups
  // average it with the same rank of the other groups before the norm (`exchange`, called by
  // finish() when set).
  using Exchange = std::function<void(float* gradients, int64_t elements)>;
  void set_exchange(Exchange exchange) { exchange_ = std::move(exchange); }
  int64_t held_elements() const;

 private:
  struct BucketState;
  void launch(int b);

  model::ParameterStore& store_;
  const BucketLayout& layout_;
  int zero_stage_;
  DataParallelGroups groups_;
  MemoryTracker* tracker_;
  CommunicationClock& clock_;
  kernels::Ops& ops_;         // the gradient norm's sums of squares
  NormClasses norm_classes_;  // from the parameters' placements
  std::vector<std::unique_ptr<BucketState>> state_;
  Tensor shard_grads_;  // stages 1-3: this rank's reduced gradient shards
  bool last_micro_ = true;
  bool finishing_ = false;  // inside finish(): held buckets launch too
  Exchange exchange_;
};

}  // namespace lattice::parallel
