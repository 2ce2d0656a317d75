// Trainer: see trainer.hpp.
#include "lattice/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/parallel/context/context_parallel_mode.hpp"
#include "lattice/parallel/context/sequence_split.hpp"
#include "lattice/train/activation_estimate.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/run_trace.hpp"
#include "lattice/train/training_step.hpp"

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

Trainer::Trainer(TrainConfig config, comm::Communicator* world) : config_(std::move(config)) {
  const mesh::MeshShape shape = layout_of(config_);
  check_activation_memory_limit(config_);  // before anything is allocated
  if (!world) {
    check(shape.world() == 1, "parallelism: " + world_text(shape) +
                                  " are needed: run through train_on_ranks (lattice train)");
    if (config_.threads > 0) omp_set_num_threads(static_cast<int>(config_.threads));
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
  mesh_ = std::make_unique<mesh::Mesh>(*world, shape, static_cast<int>(config_.hsdp_shard_size));
  group_ = &mesh_->dp_cp();
  // World rank 0 prints; the batch group's rank 0 of every tensor-parallel rank writes its slices
  // of a checkpoint (one tp group, which gathers them to the logical tensors).
  printing_ = mesh_->world().rank() == 0;
  writer_ = group_->rank() == 0;
  // Fault injection for the fault-tolerance tests: this rank dies (SIGKILL) after the given step.
  if (const char* rank = std::getenv("LATTICE_FAULT_KILL_RANK"))
    if (const char* step = std::getenv("LATTICE_FAULT_KILL_AFTER_STEP"))
      if (std::atoi(rank) == group_->rank()) fault_kill_after_step_ = std::atoll(step);
  // ... or world rank LATTICE_FAULT_STALL_RANK stalls for LATTICE_FAULT_STALL_SECONDS before step
  // LATTICE_FAULT_STALL_BEFORE_STEP (a hung stage: its peers' watchdogs must name it).
  if (const char* rank = std::getenv("LATTICE_FAULT_STALL_RANK"))
    if (const char* step = std::getenv("LATTICE_FAULT_STALL_BEFORE_STEP"))
      if (std::atoi(rank) == mesh_->world().rank()) {
        fault_stall_before_step_ = std::atoll(step);
        const char* seconds = std::getenv("LATTICE_FAULT_STALL_SECONDS");
        fault_stall_seconds_ = seconds ? std::atof(seconds) : 5.0;
      }
  // ... or world rank LATTICE_FAULT_KILL_DURING_SAVE_RANK dies while writing its files of the
  // checkpoint of step LATTICE_FAULT_KILL_DURING_SAVE_STEP.
  if (const char* rank = std::getenv("LATTICE_FAULT_KILL_DURING_SAVE_RANK"))
    if (const char* step = std::getenv("LATTICE_FAULT_KILL_DURING_SAVE_STEP"))
      if (std::atoi(rank) == mesh_->world().rank()) fault_kill_during_save_ = std::atoll(step);
  checkpoints_ = std::make_unique<ShardedCheckpointWriter>(mesh_->world());
  // The data loader splits each global batch over the dp ranks; the cp ranks of one dp index read
  // the same sequences and keep their load-balanced share of each (sequence_split.hpp).
  comm::Communicator& dp_group = mesh_->group(mesh::Axis::dp);
  batches_ = std::make_unique<BatchSource>(config_, dp_group.rank(), dp_group.size());
  if (shape.cp > 1)
    context_ =
        parallel::make_context_attention(config_.cp_mode, mesh_->group(mesh::Axis::cp), &tracker_);
  // The CLI's kernel settings (LATTICE_MATMUL_BF16_FALLBACK, LATTICE_MATMUL_NO_AMX_PACKED) are read
  // here, by the caller: the engine itself reads no environment.
  ops_ = std::make_unique<kernels::CpuOps>(kernels::MatmulOptions::from_environment());
  // Tensor parallelism: the blocks' matrices split over the tp ranks (placements in the store).
  comm::Communicator& tp = mesh_->group(mesh::Axis::tp);
  model::TensorParallelGroup tp_group{&tp, tp.rank(), tp.size(), &tp_comm_seconds_};
  tp_group.sequence_parallel = config_.sequence_parallel;
  parallel::DataParallelSettings settings;
  settings.zero_stage = static_cast<int>(config_.zero);
  settings.bucket_elements =
      std::max<int64_t>(1, static_cast<int64_t>(config_.bucket_mb * 1024 * 1024 / 4));
  settings.check_replicas = config_.check_replicas;
  settings.offload_dir = config_.offload_dir;
  if (shape.pp > 1) {
    // Pipeline parallelism: this rank's virtual stages, each with its data parallelism (bf16
    // copies kept as below; the config refuses ZeRO-3 with a pipeline).
    comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
    pipeline_ = std::make_unique<PipelineRank>(
        config_, *mesh_, *ops_, &tracker_, tp_group, settings,
        model::ExpertParallelGroup{&ep, ep.rank(), ep.size(), &ep_comm_seconds_});
  } else {
    // Expert parallelism: each rank of the ep group holds its slice of every MoE layer's experts.
    comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
    const model::ExpertParallelGroup ep_group{&ep, ep.rank(), ep.size(), &ep_comm_seconds_};
    model_ = std::make_unique<model::Transformer>(config_.model, &tracker_, model::StageRange{},
                                                  tp_group, ep_group);
    model_->set_activation_checkpointing(config_.activation_checkpoint);
    model_->initialize(config_.seed);
    dp_ = std::make_unique<parallel::DataParallel>(*ops_, *model_, *mesh_, settings, config_.adamw,
                                                   &tracker_);
    // bf16: the GEMMs read the weights' bf16 copies, rounded once per optimizer step (2 bytes per
    // parameter). Not under ZeRO-3, whose point is not to hold the whole model on every rank.
    if (config_.precision == kernels::Precision::bf16 && config_.zero < 3)
      model_->parameters().keep_bf16_copies(&tracker_);
  }
  resume();
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
  return pipeline_ ? pipeline_->model(0) : *model_;
}

parallel::DataParallel& Trainer::data_parallel() {
  return pipeline_ ? pipeline_->data_parallel(0) : *dp_;
}

double Trainer::validation_loss() {
  // Each validation batch is the global micro-batch (micro_batch_size x ranks sequences, the same
  // whatever the layout); this rank evaluates its slice and the means are averaged over ranks.
  // Under context parallelism each dp index's sequences are split over its cp ranks.
  comm::Communicator& dp_group = mesh_->group(mesh::Axis::dp);
  const int ranks = dp_group.size(), rank = dp_group.rank();
  const int cp = mesh_->size(mesh::Axis::cp);
  const int64_t B = config_.micro_batch_size, T = config_.seq_len, local_T = T / cp;
  std::vector<int32_t> inputs(static_cast<size_t>(B * ranks * T)), targets(inputs.size());
  std::vector<int32_t> local_inputs(static_cast<size_t>(B * local_T)),
      local_targets(local_inputs.size());
  model::LayerContext ctx{*ops_, config_.precision, &tracker_, dp_.get(), context_.get()};
  double sum = 0;
  for (int64_t i = 0; i < config_.val_batches; ++i) {
    batches_->validation_batch(i, inputs.data(), targets.data(), B * ranks);
    const size_t slice = static_cast<size_t>(rank * B * T);
    take_sequence_share(local_inputs.data(), inputs.data() + slice, B);
    take_sequence_share(local_targets.data(), targets.data() + slice, B);
    sum += pipeline_
               ? pipeline_->evaluate(ctx, local_inputs.data(), local_targets.data(), B, local_T)
               : model_->evaluate(ctx, local_inputs.data(), local_targets.data(), B, local_T);
  }
  return data_parallel().average(sum / static_cast<double>(config_.val_batches));
}

void Trainer::take_sequence_share(int32_t* local, const int32_t* full, int64_t batch) const {
  const int64_t T = config_.seq_len;
  if (context_ == nullptr)
    std::copy_n(full, batch * T, local);
  else
    parallel::take_context_rows(local, full, batch, T, context_->size(), context_->rank());
}

TrainResult Trainer::run() {
  const std::string config_toml = config_.to_toml();
  if (printing_) {
    fs::create_directories(config_.run_dir);
    write_text_atomic((fs::path(config_.run_dir) / "config.toml").string(), config_toml);
  }
  const int ranks = group_->size();         // the batch group: dp x cp ranks
  const int world = mesh_->world().size();  // every rank, tensor-parallel ones included
  const int tp_size = mesh_->size(mesh::Axis::tp), cp_size = mesh_->size(mesh::Axis::cp);
  const int ep_size = mesh_->size(mesh::Axis::ep);
  const int64_t B = config_.micro_batch_size, T = config_.seq_len;
  const int64_t accumulation = config_.gradient_accumulation_steps;
  // The global batch: B sequences of T tokens per dp rank (each split over its cp ranks).
  const int64_t tokens_per_step = B * T * accumulation * (ranks / cp_size);
  const double flops_per_token = config_.model.flops_per_token(T);
  double peak = config_.peak_tflops * 1e12;
  const char* peak_source = "from metrics.peak_tflops";
  if (peak <= 0 && printing_) {
    // Each rank has the same kernel threads: the run's peak is rank 0's measured peak × ranks.
    peak = calibrate_peak_flops(ops_->engine(), config_.precision) * world;
    peak_source = world > 1 ? "measured by a 1024^3 GEMM calibration, x ranks"
                            : "measured by a 1024^3 GEMM calibration";
  }
  if (printing_) {
    std::printf(
        "model %s: %lld parameters (%s), %lld layers, d_model %lld | %s | batch %lld x %lld "
        "tokens x %lld accumulation x %d ranks | %d threads per rank\n",
        config_.model.name.c_str(), static_cast<long long>(config_.model.parameter_count()),
        model::family_name(config_.model.family).c_str(),
        static_cast<long long>(config_.model.n_layers),
        static_cast<long long>(config_.model.d_model),
        std::string(kernels::precision_name(config_.precision)).c_str(), static_cast<long long>(B),
        static_cast<long long>(T), static_cast<long long>(accumulation), ranks / cp_size,
        omp_get_max_threads());
    // Under context parallelism the gradients and the loss are reduced over dp x cp.
    const std::string batch_ranks = cp_size > 1 ? "dp x cp = " + std::to_string(ranks / cp_size) +
                                                      " x " + std::to_string(cp_size) + " ranks"
                                                : std::to_string(ranks) + " ranks";
    if (ranks > 1)
      std::printf(
          "data parallel: %s (%s backend), ZeRO stage %lld%s, %zu gradient buckets%s\n",
          batch_ranks.c_str(), std::string(group_->backend()).c_str(),
          static_cast<long long>(config_.zero),
          config_.hsdp_shard_size > 0
              ? (", HSDP shard groups of " + std::to_string(config_.hsdp_shard_size)).c_str()
              : "",
          data_parallel().layout().buckets().size(),
          config_.offload_dir.empty() ? "" : ", AdamW state offloaded to files");
    if (cp_size > 1)
      std::printf(
          "context parallel: %d ranks per sequence (%s; each holds 2 of %d chunks, %lld tokens, "
          "load-balanced for the causal mask)\n",
          cp_size,
          config_.cp_mode == parallel::ContextParallelMode::ring
              ? "ring attention: key/value blocks passed around the ranks"
              : "Ulysses: all-to-all to head shards around attention",
          2 * cp_size, static_cast<long long>(T / cp_size));
    if (tp_size > 1)
      std::printf(
          "tensor parallel: %d ranks per replica (attention heads, key/value heads and MLP split; "
          "embedding, head and loss split by vocabulary), %s\n",
          tp_size,
          config_.sequence_parallel
              ? "sequence parallel (norms and residuals on 1/tp of the rows each; an all-gather "
                "and a reduce-scatter per sub-layer each way)"
              : "one all-reduce per sub-layer each way");
    if (pipeline_) {
      const pipeline::Schedule& s = pipeline_->schedule();
      std::string blocks;
      for (int stage = 0; stage < pipeline_->partition().stages(); ++stage)
        blocks += (stage ? "," : "") + std::to_string(pipeline_->partition().layers(stage));
      std::printf(
          "pipeline parallel: %d ranks, %s schedule%s, %d microbatches, %d virtual stages of "
          "[%s] blocks%s\n",
          s.num_ranks,
          config_.pipeline_schedule_file.empty() ? pipeline::schedule_kind_name(s.kind).c_str()
                                                 : config_.pipeline_schedule_file.c_str(),
          s.splits_weight_gradient ? " (B and W split)" : "", s.num_microbatches, s.num_stages(),
          blocks.c_str(),
          config_.model.tied_embeddings ? ", tied embedding summed between first and last stage"
                                        : "");
    }
    std::printf("FLOPs per token %.3g (6N + 12·L·T·d); peak %.3f TFLOP/s (%s)\n", flops_per_token,
                peak / 1e12, peak_source);
    if (config_.precision == kernels::Precision::bf16)
      std::printf("%s\n", ops_->engine().bf16_gemms().c_str());
  }

  MetricsLogger logger(
      printing_ && config_.jsonl ? (fs::path(config_.run_dir) / "metrics.jsonl").string() : "",
      printing_ && config_.tensorboard ? config_.run_dir : "");
  model::LayerContext ctx{*ops_, config_.precision, &tracker_, dp_.get(), context_.get()};
  if (config_.model.is_moe()) ctx.balancing = group_;  // the batch group dp x cp
  const auto schedule = config_.lr_schedule();
  double window_bubble = 0, window_pp_wait = 0;
  std::optional<RunTrace> trace;
  if (!config_.trace.empty()) trace.emplace(make_trace());
  TrainResult result;
  result.first_step = start_step_ + 1;
  result.rank = mesh_->world().rank();
  double window_seconds = 0, window_exposed = 0, window_comm = 0, window_tp_comm = 0;
  double window_cp_comm = 0, window_ep_comm = 0;
  int64_t window_steps = 0;
  double total_seconds = 0;
  auto set_rates = [&](StepMetrics& m, double tokens, double seconds) {
    m.tokens_per_second = tokens / seconds;
    m.tflops = m.tokens_per_second * flops_per_token / 1e12;
    m.mfu = peak > 0 ? m.tflops * 1e12 / peak : 0;
    if (ranks > 1 && config_.baseline_tokens_per_second > 0)
      m.scaling_efficiency = m.tokens_per_second / config_.baseline_tokens_per_second;
  };

  // Under context parallelism each rank runs its T / cp rows of every sequence.
  const StepShape shape{B, T / cp_size, accumulation};
  std::vector<int32_t> full_inputs, full_targets;
  if (context_) {
    full_inputs.resize(static_cast<size_t>(B * T));
    full_targets.resize(full_inputs.size());
  }
  const MicroBatchSource next_micro_batch = [&](int32_t* inputs, int32_t* targets) {
    if (!context_) {
      batches_->next(inputs, targets, B);
      return;
    }
    batches_->next(full_inputs.data(), full_targets.data(), B);
    take_sequence_share(inputs, full_inputs.data(), B);
    take_sequence_share(targets, full_targets.data(), B);
  };
  for (int64_t step = start_step_ + 1; step <= config_.steps; ++step) {
    const float lr = schedule.at(step);
    tp_comm_seconds_ = 0;  // the step's own tp all-reduces (not validation's or a checkpoint's)
    ep_comm_seconds_ = 0;  // likewise the MoE layers' expert-parallel exchanges
    if (context_) context_->take_wait_seconds();  // likewise the step's own cp waits
    if (fault_stall_before_step_ == step)
      std::this_thread::sleep_for(std::chrono::duration<double>(fault_stall_seconds_));
    const int64_t step_start_ns = steady_clock_ns();
    const StepOutcome outcome =
        pipeline_ ? pipeline_->step(ctx, shape, next_micro_batch, lr, step)
                  : training_step(*model_, *dp_, ctx, shape, next_micro_batch, lr, step);
    if (trace && step >= config_.trace_first && step <= config_.trace_last)
      trace->add_step(step, step_start_ns, steady_clock_ns(),
                      pipeline_ ? &pipeline_->executor().timeline() : nullptr);
    else if (trace)
      trace->skip_step();
    if (pipeline_) {
      result.pp_bubbles.push_back(outcome.pp_bubble);
      result.pp_wait_seconds += outcome.pp_wait_seconds;
      window_bubble += outcome.pp_bubble;
      window_pp_wait += outcome.pp_wait_seconds;
    }
    const double tp_comm = tp_comm_seconds_, ep_comm = ep_comm_seconds_;
    const double cp_comm = context_ ? context_->take_wait_seconds() : 0.0;
    std::optional<MoeStepMetrics> moe;
    if (config_.model.is_moe()) {  // collective: every rank's routing of the step
      // This rank's stage models (one without a pipeline).
      auto for_each_stage = [&](const auto& visit) {
        if (pipeline_)
          for (int i = 0; i < pipeline_->stage_count(); ++i) visit(pipeline_->model(i));
        else
          visit(*model_);
      };
      std::vector<model::MoeLayerStatistics> local;
      for_each_stage([&](model::Transformer& stage) {
        for (model::MoeLayerStatistics& s : stage.take_moe_statistics()) local.push_back(s);
      });
      moe = reduce_moe_metrics(local, config_.model, mesh_->world(), tp_size);
      // Auxiliary-loss-free balancing: every rank moves its copy of each layer's bias alike,
      // once ZeRO-1/2's gathers of the updated shards (still in flight) have landed.
      if (const double rate = config_.model.moe_bias_update_rate; rate > 0) {
        if (pipeline_)
          pipeline_->settle_parameters();
        else
          dp_->settle_parameters();
        for (const MoeLayerMetrics& layer : moe->layers)
          for_each_stage([&](model::Transformer& stage) {
            stage.update_choice_bias(layer.layer, layer.tokens_per_expert, rate);
          });
      }
    }
    if (fault_kill_after_step_ == step) {
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    const double loss = outcome.loss, norm = outcome.grad_norm, seconds = outcome.seconds;
    const parallel::CommunicationTimes& comm_times = outcome.communication;
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
    window_seconds += seconds;
    window_exposed += comm_times.exposed_seconds;
    result.exposed_comm_seconds += comm_times.exposed_seconds;
    result.comm_seconds += comm_times.total_seconds;
    window_comm += comm_times.total_seconds;
    window_tp_comm += tp_comm;
    window_ep_comm += ep_comm;
    result.tp_comm_seconds += tp_comm;
    window_cp_comm += cp_comm;
    result.cp_comm_seconds += cp_comm;
    ++window_steps;
    total_seconds += seconds;

    const bool validate = batches_->has_validation() && config_.val_freq > 0 &&
                          (step % config_.val_freq == 0 || step == config_.steps);
    StepMetrics m;
    if (validate) m.val_loss = validation_loss();  // every rank (ZeRO-3 gathers are collective)
    if (printing_) {
      m.step = step;
      m.total_steps = config_.steps;
      m.loss = loss;
      m.grad_norm = norm;
      m.lr = lr;
      m.step_seconds = seconds;
      set_rates(m, static_cast<double>(tokens_per_step), seconds);
      m.tracked_bytes = tracker_.current_total();
      m.peak_tracked_bytes = tracker_.peak_total();
      m.rss_bytes = process_rss_bytes();
      m.parameter_bytes = tracker_.current(MemoryCategory::parameters);
      m.gradient_bytes = tracker_.current(MemoryCategory::gradients);
      m.optimizer_bytes = tracker_.current(MemoryCategory::optimizer_state);
      m.activation_bytes = tracker_.current(MemoryCategory::activations);
      m.peak_activation_bytes = tracker_.peak(MemoryCategory::activations);
      if (ranks > 1) {
        m.exposed_comm_seconds = comm_times.exposed_seconds;
        m.comm_seconds = comm_times.total_seconds;
      }
      if (tp_size > 1) m.tp_comm_seconds = tp_comm;
      if (cp_size > 1) m.cp_comm_seconds = cp_comm;
      if (ep_size > 1) m.ep_comm_seconds = ep_comm;
      if (pipeline_) {
        m.pp_bubble = outcome.pp_bubble;
        m.pp_wait_seconds = outcome.pp_wait_seconds;
      }
      m.moe = moe;
      logger.record(m);
      if (step % config_.log_freq == 0 || step == result.first_step || step == config_.steps ||
          validate) {
        // The printed rates and communication times average the steps since the last line.
        StepMetrics line = m;
        set_rates(line, static_cast<double>(tokens_per_step * window_steps), window_seconds);
        if (ranks > 1) {
          line.exposed_comm_seconds = window_exposed / static_cast<double>(window_steps);
          line.comm_seconds = window_comm / static_cast<double>(window_steps);
        }
        if (tp_size > 1) line.tp_comm_seconds = window_tp_comm / static_cast<double>(window_steps);
        if (cp_size > 1) line.cp_comm_seconds = window_cp_comm / static_cast<double>(window_steps);
        if (ep_size > 1) line.ep_comm_seconds = window_ep_comm / static_cast<double>(window_steps);
        if (pipeline_) {
          line.pp_bubble = window_bubble / static_cast<double>(window_steps);
          line.pp_wait_seconds = window_pp_wait / static_cast<double>(window_steps);
        }
        logger.log_step(line);
        window_seconds = window_exposed = window_comm = window_tp_comm = window_cp_comm = 0;
        window_ep_comm = 0;
        window_bubble = window_pp_wait = 0;
        window_steps = 0;
      } else {
        logger.progress(step, config_.steps, seconds);
      }
    }
    if (validate) result.final_val_loss = *m.val_loss;
    const int64_t checkpoint_start_ns = steady_clock_ns();
    if (checkpoints_->pending()) publish_checkpoint(false);  // a background save done?
    if (config_.checkpoint_enable && config_.checkpoint_interval > 0 &&
        step % config_.checkpoint_interval == 0 && step != config_.steps) {
      logger.finish_progress();
      save(step, config_toml, false);
      ++result.checkpoints;
    }
    result.checkpoint_seconds +=
        static_cast<double>(steady_clock_ns() - checkpoint_start_ns) * 1e-9;
  }
  logger.finish_progress();
  if (trace) {
    trace->write(config_.trace, mesh_->world());
    if (printing_) std::printf("trace %s\n", config_.trace.c_str());
  }
  const int64_t final_start_ns = steady_clock_ns();
  if (config_.checkpoint_enable && config_.steps > start_step_) {
    save(config_.steps, config_toml, true);
    ++result.checkpoints;
  }
  publish_checkpoint(true);  // (nothing when no save is pending)
  result.final_checkpoint_seconds = static_cast<double>(steady_clock_ns() - final_start_ns) * 1e-9;
  if (pipeline_)
    pipeline_->settle_parameters();
  else
    dp_->settle_parameters();
  const int64_t steps_run = config_.steps - start_step_;
  if (steps_run > 0)
    result.tokens_per_second = static_cast<double>(tokens_per_step * steps_run) / total_seconds;
  return result;
}

int threads_per_rank(const TrainConfig& config, int ranks_in_process) {
  const int total = config.threads > 0 ? static_cast<int>(config.threads) : omp_get_num_procs();
  return std::max(1, total / std::max(1, ranks_in_process));
}

TrainResult train_on_ranks(const TrainConfig& config) {
  const comm::LaunchInfo launch = comm::detect_launch();
  const bool use_mpi = config.backend == "mpi" ||
                       (config.backend == "auto" && launch.launched() && launch.world_size > 1);
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
    omp_set_num_threads(config.threads > 0 ? static_cast<int>(config.threads)
                                           : threads_per_rank(config, launch.local_size));
    TrainResult result;
    {
      Trainer trainer(config, world.get());
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
    Trainer trainer(config, group);
    TrainResult mine = trainer.run();
    if (group == nullptr || group->rank() == 0) result = std::move(mine);
  });
  return result;
}

}  // namespace lattice::train
