// The `lattice estimate` verb: `estimate memory` (per-rank memory of a layout, whether it fits,
// minimum device counts) and `estimate compute` (FLOPs per token/step/budget and training time).
// Parses options and prints; the estimates live in lattice/plan.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/activation_memory.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/context/context_attention_memory.hpp"
#include "lattice/parallel/pipeline/pipeline_memory.hpp"
#include "lattice/plan/cli_options.hpp"
#include "lattice/plan/compute_estimate.hpp"
#include "lattice/plan/memory_estimate.hpp"
#include "lattice/plan/report.hpp"
#include "lattice/plan/simulator.hpp"
#include "lattice/train/activation_estimate.hpp"
#include "lattice/train/pipeline_rank.hpp"
#include "lattice/train/train_config.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct EstimateOptions {
  plan::cli::ModelOptions model;
  plan::cli::LayoutOptions layout;
  plan::cli::HardwareOptions hardware;
  bool json = false;
  double tokens = 0;
  double mfu = 0;
  double tflops = 0;
  bool simulate = false;
  std::string train_config;  // estimate memory --config: a `lattice train` TOML
};

// The options that describe the model or the layout by hand (not with --config).
// clang-format off
constexpr const char* kModelAndLayoutOptions[] = {
    "--model", "--layers", "--hidden", "--heads", "--kv-heads", "--ffn-hidden", "--vocab",
    "--seq-len", "--experts", "--top-k", "--mlp", "--gpus", "--dp", "--tp", "--pp", "--cp", "--ep",
    "--zero", "--sp", "--recompute", "--recompute-interval", "--schedule", "--virtual-stages",
    "--micro-batch", "--global-batch", "--overlap-grad-reduce", "--flash-attention"};
// clang-format on

// The model and layout of a training config, as `lattice train` would build them: the same
// loading, overrides (--section.key=value) and validation.
train::TrainConfig resolve_from_train_config(const CLI::App& verb, const EstimateOptions& o,
                                             plan::ModelSpec& model, plan::ParallelLayout& layout) {
  for (const char* name : kModelAndLayoutOptions)
    check(verb.count(name) == 0, std::string("estimate memory: ") + name +
                                     " describes the model or layout by hand, --config takes "
                                     "them from the training config: give one or the other");
  std::vector<std::string> overrides;
  for (const std::string& arg : verb.remaining()) {
    check(arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos,
          "unexpected argument '" + arg + "': config overrides look like --section.key=value");
    overrides.push_back(arg);
  }
  const train::TrainConfig config = train::load_train_config(o.train_config, overrides);
  model = plan::planning_model(config.model, config.training.seq_len);
  layout = config.layout();
  return config;
}

// This trainer's own activations on the CPU for the config's micro-batch (train/
// activation_estimate.hpp): the tensors its layers save, in its precision, with its checkpointing
// — where the estimate above counts 16-bit activations as GPU trainers keep them. Under tensor
// parallelism one tp rank's, under context parallelism one cp rank's share of each sequence.
model::ActivationMemory trainer_activations(const train::TrainConfig& config) {
  // The fused LM head keeps one weight-gradient partial per kernel thread: count a rank's, as
  // `lattice train` on the local backend shares them (training.threads, or every core, divided
  // among the dp x tp x ... ranks of the process; train::train_on_ranks).
  omp_set_num_threads(train::threads_per_rank(config, static_cast<int>(config.world_size())));
  return train::estimate_trainer_activations(config);
}

std::string mib(int64_t bytes);

// Under pipeline parallelism: each pipeline rank's activations as its schedule holds them
// (parallel/pipeline/pipeline_memory.hpp), for one tp rank of its stages.
std::vector<pipeline::PipelineActivationMemory> pipeline_activations(
    const train::TrainConfig& config) {
  omp_set_num_threads(train::threads_per_rank(config, static_cast<int>(config.world_size())));
  const pipeline::Schedule schedule = train::pipeline_schedule_of(config);
  const pipeline::StagePartition partition = train::pipeline_partition_of(config);
  model::TensorParallelGroup tp{nullptr, 0, static_cast<int>(config.parallelism.tp)};
  tp.sequence_parallel = config.parallelism.sequence_parallel;
  const kernels::CpuOps ops(kernels::MatmulOptions::from_environment());
  std::vector<pipeline::PipelineActivationMemory> ranks;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    std::vector<std::unique_ptr<model::Transformer>> models;
    std::vector<const model::Transformer*> stages;
    for (int s = 0; s < schedule.num_stages(); ++s) {
      if (schedule.stage_owner[static_cast<size_t>(s)] != rank) continue;
      models.push_back(model::Transformer::declared_only(
          config.model,
          {partition.first[static_cast<size_t>(s)], partition.first[static_cast<size_t>(s) + 1]},
          tp));
      models.back()->set_activation_checkpointing(config.activation_checkpoint);
      stages.push_back(models.back().get());
    }
    // Under context parallelism each rank holds seq_len / cp tokens of every sequence, and one
    // context-parallel attention's workspace (kept from call to call) serves all its stages.
    const int64_t local_len = config.training.seq_len / config.parallelism.cp;
    ranks.push_back(
        pipeline::estimate_pipeline_activations(schedule, rank, stages, config.training.precision,
                                                config.training.micro_batch_size, local_len, ops));
    if (config.parallelism.cp > 1)
      ranks.back().running += parallel::context_attention_transient_bytes(
          config.context_parallel.mode, config.training.micro_batch_size, local_len,
          config.model.n_heads / config.parallelism.tp,
          config.model.n_kv_heads / config.parallelism.tp, config.model.head_dim(),
          config.model.family == model::Family::gpt2 &&
              config.training.precision == kernels::Precision::bf16);
  }
  return ranks;
}

std::string mib(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

void run_memory(const CLI::App& verb, const EstimateOptions& o) {
  plan::ModelSpec model;
  plan::ParallelLayout layout;
  std::optional<train::TrainConfig> config;
  if (!o.train_config.empty()) {
    config = resolve_from_train_config(verb, o, model, layout);
  } else {
    check(verb.remaining().empty(), "unexpected argument '" +
                                        (verb.remaining().empty() ? "" : verb.remaining()[0]) +
                                        "': config overrides need --config <train.toml>");
    model = plan::cli::resolve_model(o.model);
    layout = plan::cli::resolve_layout(o.layout);
  }
  const plan::HardwareSpec hw = plan::cli::resolve_hardware(o.hardware);
  const plan::MemoryEstimate memory = plan::estimate_memory(model, layout);
  std::optional<model::ActivationMemory> trainer;
  if (config) trainer = trainer_activations(*config);
  if (o.json) {
    nlohmann::json out = plan::memory_json(model, layout, memory, hw);
    if (trainer)
      out["trainer_activations"] = {
          {"precision", config->training.precision == kernels::Precision::bf16 ? "bf16" : "fp32"},
          {"tp", config->parallelism.tp},
          {"sequence_parallel", config->parallelism.sequence_parallel},
          {"cp", config->parallelism.cp},
          {"seq_len_per_rank", config->training.seq_len / config->parallelism.cp},
          {"residual_bytes", trainer->residuals},
          {"block_bytes", trainer->blocks},
          {"recomputed_bytes", trainer->transient},
          {"head_bytes", trainer->head},
          {"backward_bytes", trainer->backward},
          {"total_bytes", trainer->total()}};
    if (config && config->parallelism.pp > 1) {
      nlohmann::json ranks = nlohmann::json::array();
      for (const auto& r : pipeline_activations(*config))
        ranks.push_back({{"in_flight", r.in_flight},
                         {"awaiting_weight", r.awaiting_weight},
                         {"held_bytes", r.held_bytes},
                         {"per_microbatch_bytes", r.per_microbatch},
                         {"per_pending_bytes", r.per_pending},
                         {"running_bytes", r.running},
                         {"total_bytes", r.total()}});
      out["trainer_pipeline_activations"] = ranks;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("%s", plan::memory_text(model, layout, memory, hw).c_str());
  if (trainer && config->parallelism.pp == 1)  // a pipeline's ranks are below, one line each
    std::printf(
        "this trainer on the CPU (%s, micro-batch %lld x %lld, recompute %s, tp %lld%s%s): "
        "activations peak %s per rank = residuals %s + blocks %s + recomputed block %s + head %s "
        "+ backward %s\n",
        config->training.precision == kernels::Precision::bf16 ? "bf16" : "fp32",
        static_cast<long long>(config->training.micro_batch_size),
        static_cast<long long>(config->training.seq_len),
        config->activation_checkpoint.describe().c_str(),
        static_cast<long long>(config->parallelism.tp),
        config->parallelism.sequence_parallel ? " sp" : "",
        config->parallelism.cp > 1
            ? (", cp " + std::to_string(config->parallelism.cp) + " " +
               parallel::context_parallel_mode_name(config->context_parallel.mode) + ": " +
               std::to_string(config->training.seq_len / config->parallelism.cp) +
               " tokens per rank")
                  .c_str()
            : "",
        mib(trainer->total()).c_str(), mib(trainer->residuals).c_str(),
        mib(trainer->blocks).c_str(), mib(trainer->transient).c_str(), mib(trainer->head).c_str(),
        mib(trainer->backward).c_str());
  if (config && config->parallelism.pp > 1) {
    const auto ranks = pipeline_activations(*config);
    std::printf("this trainer's pipeline (%s, %lld microbatches): activations per pipeline rank\n",
                config->parallelism.pipeline_schedule.c_str(),
                static_cast<long long>(config->training.gradient_accumulation_steps));
    for (size_t r = 0; r < ranks.size(); ++r)
      std::printf(
          "  pp rank %zu: %s = %d sets in flight (%d awaiting W; a set %s, its W's operands %s) "
          "holding %s + running backward %s\n",
          r, mib(ranks[r].total()).c_str(), ranks[r].in_flight, ranks[r].awaiting_weight,
          mib(ranks[r].per_microbatch).c_str(), mib(ranks[r].per_pending).c_str(),
          mib(ranks[r].held_bytes).c_str(), mib(ranks[r].running).c_str());
  }
}

void run_compute(const EstimateOptions& o) {
  const plan::ModelSpec model = plan::cli::resolve_model(o.model);
  const plan::ParallelLayout layout = plan::cli::resolve_layout(o.layout);
  const plan::HardwareSpec hw = plan::cli::resolve_hardware(o.hardware);
  check(o.tokens > 0, "give the token budget with --tokens (e.g. --tokens 300e9)");
  check(!(o.mfu > 0 && o.tflops > 0), "give --mfu or --tflops, not both");
  plan::ComputeReport report;
  report.devices = o.layout.gpus > 0 ? o.layout.gpus : layout.world_size();
  if (o.simulate) {
    const plan::SimulationResult sim = plan::simulate(model, layout, hw);
    report.flops_per_device = sim.model_tflops_per_device * 1e12;
    report.devices = layout.world_size();
    report.throughput_source = "the simulated " + fixed(sim.model_tflops_per_device, 1) +
                               " TFLOP/s per device (" + layout.describe() + ")";
  } else if (o.tflops > 0) {
    report.flops_per_device = o.tflops * 1e12;
    report.throughput_source = fixed(o.tflops, 1) + " TFLOP/s per device";
  } else {
    const double mfu = o.mfu > 0 ? o.mfu : 0.4;
    report.flops_per_device = mfu * hw.peak_bf16_flops;
    report.throughput_source = "MFU " + fixed(100 * mfu, 1) + "% of " + hw.name;
  }
  report.estimate =
      plan::estimate_compute(model, layout, o.tokens, report.devices, report.flops_per_device);
  report.megatron_eq4_seconds = plan::megatron_training_seconds(
      o.tokens, static_cast<double>(plan::count_parameters(model).active), report.devices,
      report.flops_per_device);
  if (o.json)
    std::printf("%s\n", plan::compute_json(model, report).dump(2).c_str());
  else
    std::printf("%s", plan::compute_text(model, report).c_str());
}

}  // namespace

void register_estimate_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand("estimate", "Memory and compute estimates of a training run");
  verb->require_subcommand(1);
  auto options = std::make_shared<EstimateOptions>();

  CLI::App* memory = verb->add_subcommand("memory", "Per-rank memory of a layout, and what fits");
  plan::cli::add_model_options(*memory, options->model);
  plan::cli::add_layout_options(*memory, options->layout);
  plan::cli::add_hardware_options(*memory, options->hardware);
  memory->add_flag("--json", options->json, "print JSON");
  memory->add_option("--config", options->train_config,
                     "the model and layout of a `lattice train` TOML config (overrides as "
                     "--section.key=value may follow), instead of --model and --tp ...");
  memory->allow_extras();
  memory->callback([memory, options] { run_memory(*memory, *options); });

  CLI::App* compute = verb->add_subcommand("compute", "FLOPs and training time for a token budget");
  plan::cli::add_model_options(*compute, options->model);
  plan::cli::add_layout_options(*compute, options->layout);
  plan::cli::add_hardware_options(*compute, options->hardware);
  compute->add_option("--tokens", options->tokens, "training tokens (e.g. 300e9)");
  compute->add_option("--mfu", options->mfu, "model FLOPs utilisation to assume (default 0.4)");
  compute->add_option("--tflops", options->tflops, "model TFLOP/s per device to assume");
  compute->add_flag("--simulate", options->simulate, "use the simulated throughput of the layout");
  compute->add_flag("--json", options->json, "print JSON");
  compute->callback([options] { run_compute(*options); });
}

}  // namespace lattice::cli
