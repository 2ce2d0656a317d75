// DataParallel: the model state of one data-parallel rank under plain DP or ZeRO stage 1, 2 or 3,
// driven by the training step through one interface and by the Transformer through hooks. It puts
// together three pieces, each in its own file:
//   gradient_reduction.hpp: the gradient buckets, reduced during the last micro-batch's backward,
//            and the global norm;
//   zero_parameters.hpp:    ZeRO's parameter gathers and releases (and the ZeRO-3 model hooks);
//   sharded_adamw.hpp:      AdamW on this rank's part of the state, its checkpoint reads and
//                           its import.
// Every stage uses one BucketLayout and the same arithmetic, so all stages agree bit for bit.
//   stage 0: parameters 4Ψ, gradients 4Ψ, AdamW moments 8Ψ on every rank;
//   stage 1: moments sharded (8Ψ/N) and the reduced gradient shard (4Ψ/N) beside the full local
//            gradient; updated shards are all-gathered before their next forward use;
//   stage 2: as 1, but each bucket's local gradient pages are released once handed to the
//            reduction (4Ψ + 12Ψ/N at rest);
//   stage 3: parameters sharded too (16Ψ/N at rest plus the embedding and head, kept whole).
// The groups come from the mesh (mesh.hpp): the batch group dp x cp averages the gradients and the
// loss; the ZeRO shard group dp_shard x cp shards the state; with HSDP (dp_replicate > 1, from
// parallelism.hsdp_shard_size) the state is replicated across dp_replicate and gradients are
// reduce-scattered within the shard group, then allreduced across replicas (so the sum order
// differs from plain DP's for N > 2: equal within fp32 rounding, not bit for bit). Expert
// parallelism: each rank's experts have buckets of their own (bucket_layout.hpp), reduced, sharded
// and gathered over the expert-data-parallel group (the ranks holding the same experts) with the
// same stage's rules, so the formulas hold with N → dp x cp / ep for the experts.
// Our engine keeps fp32 working parameters and fp32 gradients (bf16 only inside GEMMs), so these
// are ZeRO's formulas for fp32 parameters and gradients with fp32 Adam moments.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/communication_clock.hpp"
#include "lattice/parallel/gradient_reduction.hpp"
#include "lattice/parallel/sharded_adamw.hpp"
#include "lattice/parallel/zero_parameters.hpp"

namespace lattice::parallel {

struct DataParallelSettings {
  int zero_stage = 0;                                // 0 (plain DP), 1, 2 or 3
  int64_t bucket_elements = int64_t{25} << 20 >> 2;  // 25 MiB of fp32 gradients
  bool check_replicas = false;  // verify after each step that replicated parameters agree
  std::string offload_dir;      // AdamW moments in files under <dir>/rank<r> (empty: in memory)
};

// Throws Error naming the key when a setting is invalid.
void validate(const DataParallelSettings& settings);

// Seconds of communication since the last take: exposed = time the training thread waited for it;
// total = time the collectives ran (from the communicator's trace).
struct DataParallelTimes {
  double exposed_seconds = 0;
  double total_seconds = 0;
};

class DataParallel final : public model::ModelHooks {
 public:
  // The model must be initialised identically on every rank of the batch group (same seed). The
  // groups are the mesh's (batch dp x cp, shard dp_shard x cp, replicate dp_replicate); the mesh
  // and `ops` (the optimizer's and the gradient norm's kernels) must outlive this object.
  DataParallel(kernels::Ops& ops, model::Transformer& model, mesh::Mesh& mesh,
               DataParallelSettings settings, optim::AdamWSettings adamw, MemoryTracker* tracker);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const BucketLayout& layout() const { return layout_; }
  const DataParallelSettings& settings() const { return settings_; }
  int rank() const { return groups_.batch->rank(); }
  int ranks() const { return groups_.batch->size(); }

  // Before each micro-batch's forward; `last` marks the micro-batch whose backward reduces.
  void begin_micro_batch(bool first, bool last);
  // The bucket holding parameter unit `unit` is reduced by finish_gradients() only, not during
  // the last backward: the caller completes its gradients after the backward (a tied weight's
  // gradient summed across pipeline stages).
  void hold_reduction(int unit) { reduction_.hold(layout_.bucket_of_unit(unit)); }
  // Waits for every bucket's reduction; returns the global gradient norm (the same on all ranks).
  double finish_gradients();
  // AdamW at learning rate lr with global-norm clipping from `norm`; then the parameter gathers
  // are started (stages 1-3), finished by the next forward or by settle_parameters().
  void update(float lr, double norm);
  // Completes pending parameter gathers, and with `full` gathers every ZeRO-3 bucket (the model
  // then holds every parameter until the next forward releases them).
  void settle_parameters(bool full = false);
  // After the model's (whole, settled) values were written in place, e.g. by DiLoCo's outer step:
  // ZeRO-3 takes its shards from them and releases the rest; other stages hold them already.
  void take_whole_values() { parameters_.take_whole_values(); }
  // The mean over ranks of a per-rank value, added in rank order (the same on all ranks).
  double average(double value);
  // Throws Error naming the first rank whose replicated parameters differ from rank 0's.
  void check_replicas();

  int64_t steps_taken() const { return optimizer_.steps_taken(); }
  // Takes this rank's part of a full AdamW state and the model's (full) weights after a load.
  void import_state(const optim::AdamWOptimizer& full);
  // What this rank writes of a sharded checkpoint (train/sharded_checkpoint.hpp): its shard of
  // every bucket, the dense ones only on the first HSDP replica, so that the ranks of the batch
  // group write each element once (at stage 0 too, where every rank holds everything: the writes
  // are spread the same way). Flat ranges [begin, end) of the store.
  std::vector<std::pair<int64_t, int64_t>> checkpoint_ranges() const;
  // The AdamW moments of one such range.
  void read_moments(int64_t begin, int64_t end, float* exp_avg, float* exp_avg_sq) const {
    optimizer_.read_moments(begin, end, exp_avg, exp_avg_sq);
  }

  // Synchronous replica groups: GradientReduction::set_exchange / held_elements.
  void set_gradient_exchange(GradientReduction::Exchange exchange) {
    reduction_.set_exchange(std::move(exchange));
  }
  int64_t held_gradient_elements() const { return reduction_.held_elements(); }
  // This rank's AdamW state as it holds it (ShardedAdamW::copy_state / load_state).
  const ShardedAdamW& optimizer() const { return optimizer_; }
  ShardedAdamW& optimizer() { return optimizer_; }

  DataParallelTimes take_communication_times();

  // Hooks (called by the Transformer through LayerContext::hooks).
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  model::Transformer& model_;
  DataParallelGroups groups_;
  DataParallelSettings settings_;
  optim::AdamWSettings adamw_;
  BucketLayout layout_;
  CommunicationClock clock_;
  // In this order: the optimizer state, then the reduced gradient shards, then the ZeRO-3 master
  // parameters are allocated.
  ShardedAdamW optimizer_;
  GradientReduction reduction_;
  ZeroParameters parameters_;
  std::vector<comm::Communicator*> traced_groups_;  // each distinct group once
  std::vector<uint64_t> traced_seq_;
};

}  // namespace lattice::parallel
