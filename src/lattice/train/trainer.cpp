// Trainer: see trainer.hpp.
#include "lattice/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/parallel/context/context_parallel_mode.hpp"
#include "lattice/parallel/context/sequence_split.hpp"
#include "lattice/train/activation_estimate.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/diloco_sync.hpp"
#include "lattice/train/moe_bias_update.hpp"
#include "lattice/train/moe_metrics.hpp"
#include "lattice/train/pipelined_step_runner.hpp"
#include "lattice/train/plain_step_runner.hpp"
#include "lattice/train/run_banner.hpp"
#include "lattice/train/run_trace.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

namespace {

// The whole layout from [parallelism] (the validator's type): the world is pp x dp x cp x tp
// ranks (ep carved out of dp x cp). dp, cp, tp, pp and, for a MoE model, ep train in parallel.
mesh::MeshShape layout_of(const TrainConfig& config) {
  return config.layout().mesh_shape();
}

// "pp x dp x cp x tp = 1 x 2 x 1 x 1 = 2 ranks".
std::string world_text(const mesh::MeshShape& shape) {
  return "pp x dp x cp x tp = " + std::to_string(shape.pp) + " x " + std::to_string(shape.dp) +
         " x " + std::to_string(shape.cp) + " x " + std::to_string(shape.tp) + " = " +
         std::to_string(shape.world()) + " ranks";
}

}  // namespace

Trainer::Trainer(TrainConfig config, comm::Communicator* world, FaultInjection faults)
    : config_(std::move(config)), faults_(faults) {
  const mesh::MeshShape shape = layout_of(config_);
  check_activation_memory_limit(config_);  // before anything is allocated
  if (!world) {
    check(shape.world() == 1, "parallelism: " + world_text(shape) +
                                  " are needed: run through train_on_ranks (lattice train)");
    if (config_.training.threads > 0)
      omp_set_num_threads(static_cast<int>(config_.training.threads));
    own_world_ = std::make_unique<comm::LocalWorld>(1);
    own_group_ = own_world_->take(0);
    world = own_group_.get();
  }
  check(world->size() == shape.world(),
        "parallelism: " + world_text(shape) + " but this run has " + std::to_string(world->size()) +
            " ranks: set parallelism.dp to " +
            std::to_string(world->size() / (shape.pp * shape.cp * shape.tp)) +
            " (or -1 under a launcher)");
  // The mesh of the whole layout; HSDP: dp split into dp_replicate x dp_shard mesh axes (0: shard
  // over every dp rank).
  mesh_ = std::make_unique<mesh::Mesh>(*world, shape,
                                       static_cast<int>(config_.parallelism.hsdp_shard_size));
  group_ = &mesh_->dp_cp();
  // World rank 0 prints; the batch group's rank 0 of every tensor-parallel rank writes its slices
  // of a checkpoint (one tp group, which gathers them to the logical tensors).
  printing_ = mesh_->world().rank() == 0;
  writer_ = group_->rank() == 0;
  checkpoints_ = std::make_unique<ShardedCheckpointWriter>(mesh_->world());
  // The data loader splits each global batch over the dp ranks; the cp ranks of one dp index read
  // the same sequences and keep their load-balanced share of each (sequence_split.hpp).
  // Replica groups read disjoint blocks of one such stream, which the quorum hands out
  // (DilocoSync positions the source at each block's start).
  comm::Communicator& dp_group = mesh_->group(mesh::Axis::dp);
  batches_ = std::make_unique<BatchSource>(config_, dp_group.rank(), dp_group.size());
  // The backend, with the CLI's kernel settings (LATTICE_MATMUL_BF16_FALLBACK,
  // LATTICE_MATMUL_NO_AMX_PACKED) read by the factory: the kernels themselves read no environment.
  ops_ = kernels::make_ops(Device::cpu);
  if (shape.cp > 1)
    context_ = parallel::make_context_attention(
        config_.context_parallel.mode, mesh_->group(mesh::Axis::cp), ops_->memory(), &tracker_);
  clocks_.context = context_.get();
  // Tensor parallelism: the blocks' matrices split over the tp ranks (placements in the store).
  comm::Communicator& tp = mesh_->group(mesh::Axis::tp);
  model::TensorParallelGroup tp_group{&tp, tp.rank(), tp.size(), &clocks_.tp_seconds};
  tp_group.sequence_parallel = config_.parallelism.sequence_parallel;
  parallel::DataParallelSettings settings;
  settings.zero_stage = static_cast<int>(config_.parallelism.zero);
  settings.bucket_elements =
      std::max<int64_t>(1, static_cast<int64_t>(config_.parallelism.bucket_mb * 1024 * 1024 / 4));
  settings.check_replicas = config_.parallelism.check_replicas;
  settings.offload_dir = config_.parallelism.offload_dir;
  if (shape.pp > 1) {
    // Pipeline parallelism: this rank's virtual stages, each with its data parallelism (bf16
    // copies kept as below; the config refuses ZeRO-3 with a pipeline).
    comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
    pipeline_ = std::make_unique<PipelineRank>(
        config_, *mesh_, *ops_, &tracker_, tp_group, settings,
        model::ExpertParallelGroup{&ep, ep.rank(), ep.size(), &clocks_.ep_seconds});
    runner_ = std::make_unique<PipelinedStepRunner>(*pipeline_, clocks_);
  } else {
    // Expert parallelism: each rank of the ep group holds its slice of every MoE layer's experts.
    comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
    const model::ExpertParallelGroup ep_group{&ep, ep.rank(), ep.size(), &clocks_.ep_seconds};
    model_ = std::make_unique<model::Transformer>(config_.model, &tracker_, model::StageRange{},
                                                  tp_group, ep_group, ops_->memory());
    model_->set_activation_checkpointing(config_.activation_checkpoint);
    model_->initialize(config_.training.seed);
    dp_ = std::make_unique<parallel::DataParallel>(*ops_, *model_, *mesh_, settings,
                                                   config_.optimizer.adamw, &tracker_);
    // bf16: the GEMMs read the weights' bf16 copies, rounded once per optimizer step (2 bytes per
    // parameter). Not under ZeRO-3, whose point is not to hold the whole model on every rank.
    if (config_.training.precision == kernels::Precision::bf16 && config_.parallelism.zero < 3)
      model_->parameters().keep_bf16_copies(&tracker_);
    runner_ = std::make_unique<PlainStepRunner>(*model_, *dp_, clocks_);
  }
  resume();
  if (config_.diloco.inner_steps > 0 || config_.replica.groups > 1) {
    diloco_ = std::make_unique<DilocoSync>(config_, *runner_, mesh_->world());
    if (start_step_ > 0) diloco_->resume(resumed_from_, start_step_, resumed_quorum_, printing_);
    const RoundStart start = diloco_->join(start_step_);  // may take a running job's state
    start_step_ = start.step;
    if (start.block) move_to_block(*start.block);
  }
}

void Trainer::move_to_block(int64_t block) {
  // A block is diloco.inner_steps steps of the group's global batch.
  const int64_t samples_per_step = config_.training.micro_batch_size *
                                   config_.training.gradient_accumulation_steps *
                                   mesh_->group(mesh::Axis::dp).size();
  batches_->set_position(block * diloco_->block_steps() * samples_per_step);
}

Trainer::~Trainer() = default;

RunTrace Trainer::make_trace() {
  // One track per distinct communication group of more than one rank.
  std::vector<RunTrace::Group> groups;
  auto add = [&](const char* name, comm::Communicator& c) {
    if (c.size() < 2) return;
    for (const RunTrace::Group& g : groups)
      if (g.communicator == &c) return;
    groups.push_back({name, &c});
  };
  add("dp x cp", mesh_->dp_cp());
  add("zero shard", mesh_->dp_shard_cp());
  add("dp replicate", mesh_->group(mesh::Axis::dp_replicate));
  add("tp", mesh_->group(mesh::Axis::tp));
  add("cp", mesh_->group(mesh::Axis::cp));
  add("ep", mesh_->group(mesh::Axis::ep));
  add("expert dp", mesh_->expert_data_parallel());
  add("pp", mesh_->group(mesh::Axis::pp));
  const mesh::MeshCoordinate at = mesh_->coordinate_of(mesh_->world().rank());
  return RunTrace(mesh_->world().rank(),
                  "rank " + std::to_string(mesh_->world().rank()) + " (pp " +
                      std::to_string(at.pp) + ", dp " + std::to_string(at.dp) + ", cp " +
                      std::to_string(at.cp) + ", tp " + std::to_string(at.tp) + ")",
                  std::move(groups));
}

model::Transformer& Trainer::model() {
  return runner_->stage(0);
}

parallel::DataParallel& Trainer::data_parallel() {
  return runner_->data_parallel(0);
}

double Trainer::validation_loss() {
  // Each validation batch is the global micro-batch (micro_batch_size x ranks sequences, the same
  // whatever the layout); this rank evaluates its slice and the means are averaged over ranks.
  // Under context parallelism each dp index's sequences are split over its cp ranks.
  comm::Communicator& dp_group = mesh_->group(mesh::Axis::dp);
  const int ranks = dp_group.size(), rank = dp_group.rank();
  const int cp = mesh_->size(mesh::Axis::cp);
  const int64_t B = config_.training.micro_batch_size, T = config_.training.seq_len,
                local_T = T / cp;
  std::vector<int32_t> inputs(static_cast<size_t>(B * ranks * T)), targets(inputs.size());
  std::vector<int32_t> local_inputs(static_cast<size_t>(B * local_T)),
      local_targets(local_inputs.size());
  model::LayerContext ctx{*ops_, config_.training.precision, &tracker_, dp_.get(), context_.get()};
  double sum = 0;
  for (int64_t i = 0; i < config_.validation.batches; ++i) {
    batches_->validation_batch(i, inputs.data(), targets.data(), B * ranks);
    const size_t slice = static_cast<size_t>(rank * B * T);
    take_sequence_share(local_inputs.data(), inputs.data() + slice, B);
    take_sequence_share(local_targets.data(), targets.data() + slice, B);
    sum += runner_->evaluate(ctx, local_inputs.data(), local_targets.data(), B, local_T);
  }
  return data_parallel().average(sum / static_cast<double>(config_.validation.batches));
}

void Trainer::take_sequence_share(int32_t* local, const int32_t* full, int64_t batch) const {
  const int64_t T = config_.training.seq_len;
  if (context_ == nullptr)
    std::copy_n(full, batch * T, local);
  else
    parallel::take_context_rows(local, full, batch, T, context_->size(), context_->rank());
}

void TrainResult::add_step(const StepOutcome& step) {
  losses.push_back(step.loss);
  grad_norms.push_back(step.grad_norm);
  communication += step.communication;
  if (step.pp_bubble) pp_bubbles.push_back(*step.pp_bubble);
}

MicroBatchSource Trainer::micro_batch_source() {
  const int64_t B = config_.training.micro_batch_size;
  if (!context_)
    return [this, B](int32_t* inputs, int32_t* targets) { batches_->next(inputs, targets, B); };
  // Context parallelism: the whole sequences read, this rank's share of each kept.
  auto full =
      std::make_shared<std::vector<int32_t>>(static_cast<size_t>(2 * B * config_.training.seq_len));
  return [this, B, full](int32_t* inputs, int32_t* targets) {
    int32_t* full_inputs = full->data();
    int32_t* full_targets = full_inputs + B * config_.training.seq_len;
    batches_->next(full_inputs, full_targets, B);
    take_sequence_share(inputs, full_inputs, B);
    take_sequence_share(targets, full_targets, B);
  };
}

TrainResult Trainer::run() {
  const std::string config_toml = config_.to_toml();
  if (printing_) {
    fs::create_directories(config_.job.run_dir);
    write_text_atomic((fs::path(config_.job.run_dir) / "config.toml").string(), config_toml);
  }
  const mesh::MeshShape shape = layout_of(config_);
  const RunRates rates = run_rates(config_, shape, *ops_, printing_);
  if (printing_) print_run_banner(config_, *mesh_, rates, data_parallel(), pipeline_.get(), *ops_);
  StepReporter reporter(config_, shape, rates, start_step_ + 1, tracker_, printing_);
  model::LayerContext ctx{*ops_, config_.training.precision, &tracker_, dp_.get(), context_.get()};
  if (config_.model.is_moe()) ctx.balancing = group_;  // the batch group dp x cp
  const auto schedule = config_.lr_schedule();
  std::optional<RunTrace> trace;
  if (!config_.metrics.trace.empty()) trace.emplace(make_trace());
  TrainResult result;
  result.first_step = start_step_ + 1;
  result.rank = mesh_->world().rank();
  // Under context parallelism each rank runs its T / cp rows of every sequence.
  const StepShape step_shape{config_.training.micro_batch_size, config_.training.seq_len / shape.cp,
                             config_.training.gradient_accumulation_steps};
  const MicroBatchSource next_micro_batch = micro_batch_source();
  double total_seconds = 0;
  for (int64_t step = start_step_ + 1; step <= config_.training.steps; ++step) {
    const float lr = schedule.at(step);
    std::optional<int64_t> jump_to;  // left out of an outer step: the later step it joined at
    faults_.before_step(result.rank, step);
    const int64_t step_start_ns = steady_clock_ns();
    StepOutcome outcome = runner_->run(ctx, step_shape, next_micro_batch, lr, step);
    if (trace && step >= config_.metrics.trace_first && step <= config_.metrics.trace_last)
      trace->add_step(step, step_start_ns, steady_clock_ns(), runner_->timeline());
    else if (trace)
      trace->skip_step();
    std::optional<MoeStepMetrics> moe;
    if (config_.model.is_moe()) {  // collective: every rank's routing of the step
      moe = reduce_moe_metrics(runner_->take_moe_statistics(), config_.model, mesh_->world(),
                               shape.tp);
      update_moe_bias(*runner_, *moe, config_.model.moe_bias_update_rate);
    }
    faults_.after_step(result.rank, step);
    if (diloco_) {  // collective across the replica groups
      const int64_t bytes_before = diloco_->bytes_sent(), start_ns = steady_clock_ns();
      const std::optional<RoundStart> next = diloco_->after_step(step);
      const bool outer = diloco_->exchanges_at(step);
      if (outer && config_.replica.groups > 1) outcome.replica = diloco_->last_exchange();
      if (!outcome.replica) outcome.replica.emplace();
      outcome.replica->outer_steps = diloco_->outer_steps();
      outcome.replica->bytes_sent = diloco_->bytes_sent();
      outcome.replica->step_bytes = diloco_->bytes_sent() - bytes_before;
      // The time the step spent on the groups' exchange: its start (the quorum, the capture) and
      // its end (what was not hidden behind the inner steps, the outer step).
      outcome.replica->outer_seconds =
          outer || diloco_->starts_at(step)
              ? static_cast<double>(steady_clock_ns() - start_ns) * 1e-9
              : 0.0;
      if (outer && outcome.replica->peak_round_bytes > 0) {
        // The link that carries the largest round within the compute it can hide behind.
        const double step_seconds =
            (total_seconds + outcome.seconds) / static_cast<double>(result.losses.size() + 1);
        const double window =
            static_cast<double>(std::max<int64_t>(1, diloco_->overlap_steps())) * step_seconds;
        outcome.replica->peak_gbps =
            static_cast<double>(outcome.replica->peak_round_bytes) * 8 / window / 1e9;
      }
      if (next && next->block) move_to_block(*next->block);
      if (next && next->step != step) jump_to = next->step;
    }
    result.add_step(outcome);
    total_seconds += outcome.seconds;
    std::optional<double> val_loss;  // on every rank (ZeRO-3's gathers are collective)
    if (batches_->has_validation() && config_.validation.freq > 0 &&
        (step % config_.validation.freq == 0 || step == config_.training.steps)) {
      val_loss = validation_loss();
      result.final_val_loss = *val_loss;
    }
    reporter.report(step, lr, outcome, val_loss, moe);
    checkpoint_after_step(step, config_toml, reporter, result);
    if (jump_to) {
      if (printing_)
        std::printf("diloco: this group continues after step %lld with the job's state\n",
                    static_cast<long long>(*jump_to));
      step = *jump_to;
    }
  }
  reporter.finish_progress();
  if (diloco_) {
    result.outer_steps = diloco_->outer_steps();
    result.replica_bytes_sent = diloco_->bytes_sent();
    if (printing_ && config_.diloco.inner_steps > 0)
      std::printf("diloco: %lld outer steps, %.3f MB sent to the other groups by rank 0\n",
                  static_cast<long long>(result.outer_steps),
                  static_cast<double>(result.replica_bytes_sent) / 1e6);
    else if (printing_)
      std::printf("replica groups (synchronous): %.3f MB sent to the other groups by rank 0\n",
                  static_cast<double>(result.replica_bytes_sent) / 1e6);
  }
  finish_run(config_toml, trace ? &*trace : nullptr, result);
  const int64_t steps_run = config_.training.steps - start_step_;
  if (steps_run > 0)
    result.tokens_per_second =
        static_cast<double>(rates.tokens_per_step * steps_run) / total_seconds;
  return result;
}

void Trainer::checkpoint_after_step(int64_t step, const std::string& config_toml,
                                    StepReporter& reporter, TrainResult& result) {
  const int64_t start_ns = steady_clock_ns();
  if (checkpoints_->pending()) publish_checkpoint(false);  // a background save done?
  if (config_.checkpoint.enable && config_.checkpoint.interval > 0 &&
      step % config_.checkpoint.interval == 0 && step != config_.training.steps) {
    reporter.finish_progress();
    save(step, config_toml, false);
    ++result.checkpoints;
  }
  result.checkpoint_seconds += static_cast<double>(steady_clock_ns() - start_ns) * 1e-9;
}

void Trainer::finish_run(const std::string& config_toml, RunTrace* trace, TrainResult& result) {
  if (trace) {
    trace->write(config_.metrics.trace, mesh_->world());
    if (printing_) std::printf("trace %s\n", config_.metrics.trace.c_str());
  }
  const int64_t start_ns = steady_clock_ns();
  if (config_.checkpoint.enable && config_.training.steps > start_step_) {
    save(config_.training.steps, config_toml, true);
    ++result.checkpoints;
  }
  publish_checkpoint(true);  // (nothing when no save is pending)
  result.final_checkpoint_seconds = static_cast<double>(steady_clock_ns() - start_ns) * 1e-9;
  runner_->settle_parameters();
}

int threads_per_rank(const TrainConfig& config, int ranks_in_process) {
  const int total =
      config.training.threads > 0 ? static_cast<int>(config.training.threads) : omp_get_num_procs();
  return std::max(1, total / std::max(1, ranks_in_process));
}

TrainResult train_on_ranks(const TrainConfig& config, const FaultInjection& faults) {
  const comm::LaunchInfo launch = comm::detect_launch();
  const bool use_mpi =
      config.parallelism.backend == "mpi" ||
      (config.parallelism.backend == "auto" && launch.launched() && launch.world_size > 1);
  if (use_mpi) {
    check(comm::mpi_backend_available(),
          "parallelism.backend = mpi, but this build has no MPI: install Open MPI and rebuild, or "
          "use the local backend (lattice train --dp N without mpirun)");
    comm::MpiSession session;
    std::unique_ptr<comm::Communicator> world = session.world();
    const mesh::MeshShape shape = layout_of(config);
    check(world->size() == shape.world(),
          "parallelism: " + world_text(shape) + ", but the launcher started " +
              std::to_string(world->size()) + ": pass --dp " +
              std::to_string(world->size() / (shape.pp * shape.cp * shape.tp)) +
              " (or --dp -1), or start " + std::to_string(shape.world()) + " ranks");
    omp_set_num_threads(config.training.threads > 0 ? static_cast<int>(config.training.threads)
                                                    : threads_per_rank(config, launch.local_size));
    TrainResult result;
    {
      Trainer trainer(config, world.get(), faults);
      result = trainer.run();
    }
    world.reset();  // before the session finalizes MPI
    return result;
  }
  const int ranks = layout_of(config).world();
  const int threads = threads_per_rank(config, ranks);
  TrainResult result;
  comm::run_local_ranks_or_inline(ranks, [&](comm::Communicator* group) {
    omp_set_num_threads(threads);
    Trainer trainer(config, group, faults);
    TrainResult mine = trainer.run();
    if (group == nullptr || group->rank() == 0) result = std::move(mine);
  });
  return result;
}

}  // namespace lattice::train
