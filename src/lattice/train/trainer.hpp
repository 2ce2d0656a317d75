// Trainer: the training loop of one rank — this rank's share of each global batch through a
// StepRunner (step_runner.hpp: training_step.hpp's step, or under pipeline parallelism
// pipeline_step.hpp's on this rank's stages, train/pipeline_rank.hpp: forward and backward over the
// micro-batches of a step with gradient buckets reduced during the last backward, the global
// gradient norm and clipping, AdamW on this rank's part of the state: plain DP or ZeRO-1/2/3, see
// parallel/data_parallel.hpp), the MoE bias update (moe_bias_update.hpp), periodic validation,
// metrics (step_reporter.hpp) and checkpoints (sharded: every rank writes its own part; any layout
// resumes them), and bit-identical resumption. train_on_ranks() runs it on every rank: threads of
// this process (`local` backend) or one process per rank under mpirun (`mpi` backend).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/train/batch_source.hpp"
#include "lattice/train/communication_times.hpp"
#include "lattice/train/fault_injection.hpp"
#include "lattice/train/pipeline_rank.hpp"
#include "lattice/train/run_trace.hpp"
#include "lattice/train/sharded_checkpoint.hpp"
#include "lattice/train/step_reporter.hpp"
#include "lattice/train/step_runner.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::comm {
class LocalWorld;
}

namespace lattice::train {

class DilocoSync;

struct TrainResult {
  std::vector<double> losses;  // training loss of every step run (mean over the global batch)
  std::vector<double> grad_norms;
  double final_val_loss = 0;
  int64_t first_step = 1;  // 1 + the step resumed from
  double tokens_per_second = 0;
  // This rank's communication of every family, summed over the steps run.
  CommunicationTimes communication;
  // Pipeline parallelism: the measured bubble of each step run (empty without).
  std::vector<double> pp_bubbles;
  // Checkpoints: how many were started, the training thread's time in the interval ones (their
  // snapshot and, when synchronous, their writing; publishing included), and in the final one
  // (always waited for, with a background save still pending).
  int64_t checkpoints = 0;
  double checkpoint_seconds = 0, final_checkpoint_seconds = 0;
  int rank = 0;  // the world rank that ran it (rank 0 reports)
  // DiLoCo: outer steps taken and the bytes this rank sent to the other replica groups.
  int64_t outer_steps = 0, replica_bytes_sent = 0;

  // Adds a step's loss, gradient norm, communication and bubble.
  void add_step(const StepOutcome& step);
};

class Trainer {
 public:
  // `world`: every rank of this run; the trainer lays them out in a mesh::Mesh of the whole
  // [parallelism] layout (pp, dp, cp, tp, ep; dp split for HSDP) and trains data-parallel over its
  // dp x cp group. Null runs one rank on a private
  // one-rank world.
  // `faults`: what a test injects (fault_injection.hpp); nothing by default.
  explicit Trainer(TrainConfig config, comm::Communicator* world = nullptr,
                   FaultInjection faults = {});
  ~Trainer();
  // Runs steps until training.steps; rank 0 prints the metric lines and writes JSONL and
  // checkpoints. Collective over the data-parallel group.
  TrainResult run();

  // This rank's model (under pipeline parallelism, its first virtual stage) and its data
  // parallelism.
  model::Transformer& model();
  const TrainConfig& config() const { return config_; }
  parallel::DataParallel& data_parallel();
  // The pipeline rank (null without pipeline parallelism).
  PipelineRank* pipeline() { return pipeline_.get(); }
  const MemoryTracker& memory() const { return tracker_; }
  // Mean validation loss over validation.batches fixed global batches, split over the ranks
  // (the same value on every rank and, up to rounding, in every layout). Collective.
  double validation_loss();
  // Every parameter of this rank's model, whole over the batch group (gathers ZeRO-3 shards;
  // collective); under tensor parallelism, still this rank's slices; under pipeline parallelism,
  // its first stage's.
  const model::ParameterStore& full_parameters();
  // The logical parameter values, laid out as a one-rank model's flat store, on world rank 0
  // (empty elsewhere): ZeRO's shards gathered over the batch group, the tensor-parallel slices
  // over the tp group and the pipeline stages over the pp group. Collective.
  std::vector<float> logical_parameters();

 private:
  // Collective: every rank writes its part of the checkpoint of `step` (in the background under
  // checkpoint.async, unless `final`), after publishing a save still pending.
  void save(int64_t step, const std::string& config_toml, bool final);
  // Collective while a save is pending: publishes it once every rank has written (with `wait`,
  // waits for that) and prints its line.
  void publish_checkpoint(bool wait);
  // The trace of metrics.trace_steps: this rank's process and its groups' tracks.
  RunTrace make_trace();
  // Loads the checkpoint to resume from, if any: the explicit one, or the run's latest, falling
  // back to the previous good one with a warning when the latest is damaged. Collective.
  void resume();

  TrainConfig config_;
  MemoryTracker tracker_;
  std::unique_ptr<comm::LocalWorld> own_world_;
  std::unique_ptr<comm::Communicator> own_group_;
  std::unique_ptr<mesh::Mesh> mesh_;
  comm::Communicator* group_ = nullptr;  // the data-parallel group (mesh dp x cp)
  bool printing_ = true;                 // world rank 0
  bool writer_ = true;                   // the batch group's rank 0 (one per tp rank): checkpoints
  std::unique_ptr<kernels::Ops> ops_;
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<model::Transformer> model_;  // without pipeline parallelism
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<PipelineRank> pipeline_;  // pp > 1: the stages, their DP and the executor
  int64_t start_step_ = 0;
  std::string resumed_from_;    // the checkpoint resumed from ("" when none)
  std::string resumed_quorum_;  // its replica quorum record ("" when none)
  std::unique_ptr<ShardedCheckpointWriter> checkpoints_;
  bool background_save_ = false;  // the pending (or last) save writes in the background
  FaultInjection faults_;
  CommunicationClocks clocks_;  // the model's tp and ep groups add their time here
  // cp > 1: the attention spanning this rank's cp group (ring or Ulysses); null otherwise.
  std::unique_ptr<model::ContextAttention> context_;
  // The steps' runner over model_ and dp_, or over pipeline_.
  std::unique_ptr<StepRunner> runner_;
  // diloco.inner_steps > 0: the outer steps between replica groups (after runner_).
  std::unique_ptr<DilocoSync> diloco_;
  // This rank's rows of full [batch, seq_len] tokens (all of them without context parallelism).
  void take_sequence_share(int32_t* local, const int32_t* full, int64_t batch) const;
  // Replica groups: the data source at the start of data block `block` (DilocoSync).
  void move_to_block(int64_t block);
  // This rank's micro-batches of the training data: its dp slice, its cp share of each sequence.
  MicroBatchSource micro_batch_source();
  // After step `step`: publishes a finished background save, saves at checkpoint.interval (the
  // last step's save is the final one).
  void checkpoint_after_step(int64_t step, const std::string& config_toml, StepReporter& reporter,
                             TrainResult& result);
  // After the last step: writes the trace, saves the final checkpoint, settles the parameters.
  void finish_run(const std::string& config_toml, RunTrace* trace, TrainResult& result);
};

// Runs training on the layout's pp x dp x cp x tp ranks: under a launcher (mpirun, srun,
// torchrun variables) one process per rank on the mpi backend, else that many threads of this
// process on the local backend, each with training.threads / ranks kernel threads (every core /
// ranks when 0). Returns rank 0's result (or this process's rank's under MPI).
// parallelism.backend forces a backend. `faults`: what a test injects, on every rank.
TrainResult train_on_ranks(const TrainConfig& config, const FaultInjection& faults = {});

// Kernel threads per rank: training.threads, or every core, shared among this process's ranks (as
// train_on_ranks gives them; the activation estimate counts the fused head's per-thread partials
// with it).
int threads_per_rank(const TrainConfig& config, int ranks_in_process);

}  // namespace lattice::train
