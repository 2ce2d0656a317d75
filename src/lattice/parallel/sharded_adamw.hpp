// ShardedAdamW: AdamW on this data-parallel rank's part of the state: the whole buffer under plain
// DP (stage 0), this rank's shard of every bucket under ZeRO (stages 1-3), element by element with
// the same kernel, so every stage computes the same bits. The moments live in memory or, with an
// offload directory, in files (optim::OffloadedAdamWState, streamed through the same kernel:
// bit-identical). Also the moments of any range this rank holds, for the sharded checkpoints each
// rank writes, and the import of this rank's part from a full state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/optim/offload_adamw_state.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/zero_parameters.hpp"

namespace lattice::parallel {

class ShardedAdamW {
 public:
  // `offload_directory` empty: moments in memory. `shard_rank`: this rank's shard of each dense
  // bucket; `expert_rank`: of each expert bucket (its rank in the expert-data-parallel group).
  ShardedAdamW(kernels::Ops& ops, const model::ParameterStore& store, const BucketLayout& layout,
               int zero_stage, int shard_rank, int expert_rank, optim::AdamWSettings settings,
               const std::string& offload_directory, MemoryTracker* tracker);

  // One update at learning rate lr with gradients scaled by `clip`: stage 0 over the store's
  // values and gradients; stages 1-3 over this rank's shards (values where `parameters` keeps
  // them, gradients from `shard_grads`).
  void step(model::ParameterStore& store, ZeroParameters& parameters, const float* shard_grads,
            float lr, float clip);
  int64_t steps_taken() const { return step_; }

  // Takes this rank's part of a full AdamW state.
  void import_state(const optim::AdamWOptimizer& full);
  // Copies the moments of the flat elements [begin, end), which this rank holds: any range at
  // stage 0, a range inside this rank's shard of one bucket at stages 1-3 (what sharded
  // checkpoints write; read back from the files under offload).
  void read_moments(int64_t begin, int64_t end, float* exp_avg, float* exp_avg_sq) const;

  // This rank's whole state, as it holds it (another rank of the same place in the same layout
  // holds the same shapes): the moments, state_elements() floats each, and the step count. A
  // replica group that joins a running job takes it from a live group (moments in memory only).
  int64_t state_elements() const;
  void copy_state(float* exp_avg, float* exp_avg_sq) const;
  void load_state(const float* exp_avg, const float* exp_avg_sq, int64_t steps_taken);

 private:
  // This rank's shard index in `bucket`'s group.
  int rank_in(const Bucket& bucket) const { return bucket.expert ? expert_rank_ : shard_rank_; }

  const BucketLayout& layout_;
  int zero_stage_;
  int shard_rank_, expert_rank_;
  optim::AdamWSettings settings_;
  Tensor m_, v_;  // AdamW moments: whole buffer (stage 0) or this rank's shards
  std::unique_ptr<optim::OffloadedAdamWState> offload_;  // instead of m_ and v_
  std::vector<optim::DecayRange> decay_;  // offload: where weight decay applies (state offsets)
  MemoryTracker* tracker_;
  kernels::Ops& ops_;  // the in-memory updates (the offloaded state streams on the host)
  int64_t step_ = 0;
};

}  // namespace lattice::parallel
