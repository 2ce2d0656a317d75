// TrainConfig: everything a training run is told, read from TOML in sections after torchtitan's
// ([job] [model] [training] [optimizer] [lr_scheduler] [parallelism] [context_parallel]
// [activation_checkpoint] [checkpoint] [metrics] [data] [validation]) with `--section.key=value`
// overrides. The keys, their types and help are one table (config_schema.hpp, config_keys.cpp;
// `lattice train --help-config`); the defaults are the members' initialisers below. Unknown keys,
// wrong types and inconsistent values are refused with one line that names the key and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/kernels/precision.hpp"
#include "lattice/mesh/mesh_shape.hpp"
#include "lattice/model/activation_checkpoint.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/optim/lr_schedule.hpp"
#include "lattice/parallel/context/context_parallel_mode.hpp"
#include "lattice/parallel/parallel_layout.hpp"
#include "lattice/parallel/replica/outer_codec.hpp"

namespace lattice::train {

// One struct per [section]; each member is the key of the same name (config_keys.cpp), except
// where a comment says otherwise. The members' initialisers are the keys' defaults.
struct JobConfig {
  std::string run_dir = "runs/default";
  std::string description;
};

struct TrainingConfig {
  uint64_t seed = 1234;
  int64_t steps = 100;
  int64_t seq_len = 128;
  int64_t micro_batch_size = 0;   // give two of micro_batch_size, global_batch_size and
  int64_t global_batch_size = 0;  // gradient_accumulation_steps; the third is derived
  int64_t gradient_accumulation_steps = 0;
  kernels::Precision precision = kernels::Precision::fp32;
  int64_t threads = 0;  // kernel threads; 0 = every core
  // Refuse the run when its estimated activation memory per rank (activation_estimate.hpp)
  // exceeds this many MiB; 0: no limit.
  double activation_memory_limit_mb = 0;
  // (training.max_norm is OptimizerConfig::adamw.max_grad_norm.)
};

struct OptimizerConfig {
  float lr = 3e-4f;
  optim::AdamWSettings adamw;  // beta1, beta2, eps, weight_decay; and training.max_norm
};

struct LrSchedulerConfig {
  int64_t warmup_steps = 0;
  optim::DecayKind decay = optim::DecayKind::cosine;
  float min_lr_ratio = 0.1f;
};

// The world is dp x tp x pp x cp ranks (dp = -1: the rest of the launcher's world size), with ZeRO
// stage `zero` (0-3); ep expert-parallel ranks are carved out of dp x cp (a MoE model's experts
// split over them; parallel::validate_layout checks that ep divides dp x cp and the experts).
struct ParallelismConfig {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, zero = 0;
  // Pipeline parallelism (pp > 1): the schedule (gpipe, 1f1b, interleaved, zb-h1, zb-v; its
  // microbatches are training.gradient_accumulation_steps), virtual stages per rank (0: the
  // schedule's own), the blocks of each virtual stage (empty: by pipeline_partition, "even" or
  // "balanced" by cost), and a schedule file (JSON or CSV action lists) that replaces the
  // generated schedule.
  std::string pipeline_schedule = "1f1b";
  int64_t virtual_stages = 0;
  std::vector<int64_t> pipeline_layers;
  std::string pipeline_partition = "even";
  std::string pipeline_schedule_file;
  double bucket_mb = 25;           // gradient bucket size (MiB of fp32 gradients)
  bool sequence_parallel = false;  // with tp > 1: norms and residuals on each rank's sequence rows
  bool check_replicas = false;     // verify after each step that replicated parameters agree
  std::string backend = "auto";    // "auto" (mpi under a launcher, else local), "local" or "mpi"
  double baseline_tokens_per_second = 0;  // single-rank rate for the DP scaling efficiency; 0: none
  int64_t hsdp_shard_size =
      0;                    // HSDP: shard the state within groups of this many dp ranks (0: all)
  std::string offload_dir;  // AdamW moments in files under <dir>/rank<r> (empty: in memory)
};

// mode = ring | ulysses: how attention reaches the other cp ranks' keys.
struct ContextParallelConfig {
  parallel::ContextParallelMode mode = parallel::ContextParallelMode::ring;
};

struct CheckpointConfig {
  bool enable = true;
  int64_t interval = 0;  // steps between checkpoints; 0 = only at the end
  int64_t keep_latest = 2;
  // Write each interval checkpoint's files in the background from a snapshot of the state while
  // training goes on (published at a later step boundary); the final checkpoint is waited for.
  bool async = false;
  bool resume = true;       // resume from run_dir's latest checkpoint when there is one
  std::string resume_from;  // explicit checkpoint directory to resume from
  // Fine-tuning: a step-0 checkpoint (what `lattice import` writes) or its run directory whose
  // weights start this run when it has no checkpoint of its own; its model settings are the run's
  // (a config giving [model] keys too is refused).
  std::string init_from;
};

struct MetricsConfig {
  int64_t log_freq = 10;
  bool jsonl = true;
  bool tensorboard = true;  // TensorBoard event files in run_dir, the JSONL's numbers as scalars
  double peak_tflops = 0;   // 0 = measure with a short GEMM calibration at start
  std::string trace;        // a Chrome trace of steps trace_first..trace_last; empty: none (unless
                            // trace_steps is set: finalize() then names <run_dir>/trace.json)
  std::string trace_steps;  // "a:b": trace steps a to b (default trace <run_dir>/trace.json)
  int64_t trace_first = 1, trace_last = 50;  // no keys: resolved from trace_steps by finalize()
};

struct DataConfig {
  std::vector<std::string> train_files;
  std::vector<std::string> exclude = {"*.dat", "*.u8"};
  double val_fraction = 0.05;
  std::string tokenizer = "byte";  // "byte" or a tokenizer path (made absolute by finalize)
  // Token files (docs/data.md): a `lattice data prepare` directory, llm.c shard globs or a
  // Megatron prefix; when set, train_files is not read.
  std::string dataset;
  std::string format = "auto";  // auto | prepared | llmc | megatron
  std::string val_dataset;      // validation token files for llmc/megatron (optional)
};

struct ValidationConfig {
  int64_t freq = 50;  // 0 disables
  int64_t batches = 4;
};

// [replica]: replica groups (docs/parallelism.md): the job is `groups` groups, each its own run of
// any layout (threads or one mpirun), joined between groups by Gloo over TCP with etcd as the
// membership store. This process's ranks are group `group`.
struct ReplicaConfig {
  int64_t groups = 1;
  int64_t group = 0;
  std::string store;               // etcd's client address host:port (needed when groups > 1)
  std::string host = "127.0.0.1";  // the address this group's ranks listen on for the others
  std::string job = "lattice";  // the job's name: its keys in the store are under /lattice/<job>/
  double timeout_seconds = 60;  // a silent group's grace (start, outer steps, exchanges)
  int64_t min_groups = 1;       // an outer step with fewer live groups is an error
  int64_t lease_seconds = 5;    // a killed group leaves the quorum when its lease runs out
};

// [diloco]: DiLoCo (Douillard et al. 2023): every inner_steps steps the groups average their
// parameters and an outer SGD (Nesterov momentum) steps the pseudo-gradient (outer_optimizer.hpp).
// Streaming DiLoCo (Douillard et al. 2025): the model in `fragments` fragments synchronised one
// after another every inner_steps / fragments steps, each exchange overlapped with the next
// `overlap_steps` inner steps and its result mixed into the parameters trained meanwhile
// (θ ← mixing·θ_local + (1 − mixing)·θ_global), the outer gradients sent in `exchange` precision.
struct DilocoConfig {
  int64_t inner_steps = 0;  // H; 0: off
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool nesterov = true;
  int64_t fragments = 1;      // P
  int64_t overlap_steps = 0;  // τ, in [0, H / P)
  double mixing = 0.5;        // α, with overlap_steps > 0
  replica::OuterPrecision exchange = replica::OuterPrecision::fp32;
  bool streaming() const {
    return fragments > 1 || overlap_steps > 0 || exchange != replica::OuterPrecision::fp32;
  }
};

struct TrainConfig {
  JobConfig job;
  // [model]: the preset's name and the model it gives, then any dimension overridden. (The model
  // is the planner's model::ModelConfig, so the preset's name stays beside it.)
  std::string model_preset = "gpt2-demo";
  model::ModelConfig model = model::model_preset("gpt2-demo");
  TrainingConfig training;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  ParallelismConfig parallelism;
  ContextParallelConfig context_parallel;
  // [activation_checkpoint] mode = none | selective | full, interval (full: every k-th block)
  model::ActivationCheckpoint activation_checkpoint;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  DataConfig data;
  ValidationConfig validation;
  ReplicaConfig replica;
  DilocoConfig diloco;

  optim::LrSchedule lr_schedule() const;
  // Ranks of the run: dp x tp x pp x cp.
  int64_t world_size() const {
    return parallelism.dp * parallelism.tp * parallelism.pp * parallelism.cp;
  }
  // The run's parallel layout (the planner's type): degrees, ZeRO and HSDP, batch, recompute, and
  // the trainer's storage (fp32 weights and gradients, two fp32 Adam moments, bf16 weight copies in
  // bf16 below ZeRO-3; fused attention; reduction overlapped with backward).
  parallel::ParallelLayout layout() const;
  // Derives the missing batch quantity and checks every cross-key constraint.
  void finalize();
  // The resolved configuration as TOML (written into the run directory).
  std::string to_toml() const;
};

// The rank grid of `config` on a world of `world_size` ranks (the communicator's size): what the
// trainer builds its mesh from. Throws lattice::Error with one line when dp x tp x pp x cp is not
// the world size (dp = -1 is resolved by finalize).
mesh::MeshShape resolve_layout(const TrainConfig& config, int world_size);

// Reads a TOML file (empty path: defaults only) and applies overrides of the form
// "section.key=value" (values parsed as TOML, or taken as strings when they do not parse).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace lattice::train
