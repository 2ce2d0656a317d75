// DataParallel: the model state of one data-parallel rank under plain DP or ZeRO stage 1, 2 or 3,
// driven by the trainer through one interface and by the Transformer through hooks.
//
// Every stage uses one BucketLayout and the same arithmetic, so all stages agree bit for bit:
// when a bucket's last gradient is final during the last micro-batch's backward, its gradients
// (pre-scaled by 1/N) are reduce-scattered asynchronously into this rank's shard while backward
// goes on; plain DP then all-gathers the reduced bucket back (an allreduce made of the same
// reduce-scatter). The global norm is computed from fixed chunks (global_norm.hpp); AdamW runs
// over the whole buffer (DP) or this rank's shard (ZeRO), element by element with the same kernel.
//   stage 0: parameters 4Ψ, gradients 4Ψ, AdamW moments 8Ψ on every rank;
//   stage 1: moments sharded (8Ψ/N) and the reduced gradient shard (4Ψ/N) beside the full local
//            gradient; updated shards are all-gathered, each bucket's gather waited for just
//            before its first forward use (overlapping the next step's forward);
//   stage 2: as 1, but each bucket's local gradient pages are released once handed to the
//            reduction (4Ψ + 12Ψ/N at rest);
//   stage 3: parameters sharded too (16Ψ/N at rest plus the embedding and head, kept whole): a
//            bucket's parameters are gathered before its forward and again before its backward,
//            the next bucket is prefetched, and the pages are released after use.
// HSDP (stages 1-3 with shard_group_size S < N): state is sharded over groups of S consecutive
// ranks and replicated across the N/S groups; gradients are reduce-scattered within the group,
// then allreduced across groups (so the sum order differs from plain DP's for N > 2: equal within
// fp32 rounding, not bit for bit).
// Offload (offload_dir set): the AdamW moments live in files (optim::OffloadedAdamWState), streamed
// through the same kernel: bit-identical to in memory.
// Our engine keeps fp32 working parameters and fp32 gradients (bf16 only inside GEMMs), so these
// are ZeRO's formulas for fp32 parameters and gradients with fp32 Adam moments.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/optim/offload_adamw_state.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/global_norm.hpp"

namespace lattice::parallel {

struct DataParallelSettings {
  int zero_stage = 0;                                // 0 (plain DP), 1, 2 or 3
  int64_t bucket_elements = int64_t{25} << 20 >> 2;  // 25 MiB of fp32 gradients
  bool check_replicas = false;  // verify after each step that replicated parameters agree
  int shard_group_size = 0;     // HSDP: shard within groups of this many ranks (0: all ranks)
  std::string offload_dir;      // AdamW moments in files under <dir>/rank<r> (empty: in memory)
};

// Throws Error naming the key when a setting is invalid.
void validate(const DataParallelSettings& settings);

// Seconds of communication since the last take: exposed = time the training thread waited for it;
// total = time the collectives ran (from the communicator's trace).
struct CommunicationTimes {
  double exposed_seconds = 0;
  double total_seconds = 0;
};

class DataParallel final : public model::ModelHooks {
 public:
  // The model must be initialised identically on every rank of `group` (same seed).
  DataParallel(model::Transformer& model, comm::Communicator& group, DataParallelSettings settings,
               optim::AdamWSettings adamw, MemoryTracker* tracker);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const BucketLayout& layout() const { return layout_; }
  const DataParallelSettings& settings() const { return settings_; }
  int rank() const { return group_.rank(); }
  int ranks() const { return group_.size(); }

  // Before each micro-batch's forward; `last` marks the micro-batch whose backward reduces.
  void begin_micro_batch(bool first, bool last);
  // Waits for every bucket's reduction; returns the global gradient norm (the same on all ranks).
  double finish_gradients();
  // AdamW at learning rate lr with global-norm clipping from `norm`; then the parameter gathers
  // are started (stages 1-3), finished by the next forward or by settle_parameters().
  void update(float lr, double norm);
  // Completes pending parameter gathers, and with `full` gathers every ZeRO-3 bucket (the model
  // then holds every parameter until the next forward releases them).
  void settle_parameters(bool full = false);
  // The mean over ranks of a per-rank value, added in rank order (the same on all ranks).
  double average(double value);
  // Throws Error naming the first rank whose replicated parameters differ from rank 0's.
  void check_replicas();

  int64_t steps_taken() const { return step_; }
  // Collective. Writes the full AdamW state into `full` on rank 0 (null elsewhere); call
  // settle_parameters(true) first when the model's weights are needed too (checkpoints).
  void export_state(optim::AdamWOptimizer* full);
  // Takes this rank's part of a full AdamW state and the model's (full) weights after a load.
  void import_state(const optim::AdamWOptimizer& full);

  CommunicationTimes take_communication_times();

  // Hooks (called by the Transformer through LayerContext::hooks).
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  struct BucketState;
  void launch_reduction(int bucket);
  void start_gather(int bucket);
  void finish_gather(int bucket);
  void release_parameters(int bucket);
  void wait(comm::CommHandle& handle);
  float* shard_parameters(const Bucket& bucket);
  int shard_rank() const { return shard_->rank(); }
  int shard_ranks() const { return shard_->size(); }

  model::Transformer& model_;
  comm::Communicator& group_;                                  // every data-parallel rank
  std::unique_ptr<comm::Communicator> own_shard_, replicate_;  // HSDP groups
  comm::Communicator* shard_ = nullptr;  // the ranks that shard the state (group_ without HSDP)
  DataParallelSettings settings_;
  optim::AdamWSettings adamw_;
  MemoryTracker* tracker_;
  BucketLayout layout_;
  NormClasses norm_classes_;  // from the parameters' placements
  std::vector<std::unique_ptr<BucketState>> state_;
  Tensor m_, v_;  // AdamW moments: whole buffer (stage 0) or this rank's shards
  std::unique_ptr<optim::OffloadedAdamWState> offload_;  // instead of m_ and v_
  std::vector<optim::DecayRange> decay_;  // offload: where weight decay applies (state offsets)
  Tensor shard_grads_;                    // stages 1-3: this rank's reduced gradient shards
  Tensor shard_params_;                   // stage 3: this rank's parameter shards (the master copy)
  bool last_micro_ = true;
  int64_t step_ = 0;
  double exposed_seconds_ = 0;
  uint64_t traced_seq_[3] = {0, 0, 0};  // group_, shard group, replicate group
};

}  // namespace lattice::parallel
