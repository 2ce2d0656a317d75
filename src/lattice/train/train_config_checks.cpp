// TrainConfig::finalize: the checks across keys and the values derived from them (see
// train_config.hpp) — the batch triple, the data and pipeline keys, the layout against the model,
// and what this trainer cannot run yet. One clear line per refusal, naming the key and the fix.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"
#include "lattice/data/dataset_manifest.hpp"
#include "lattice/data/token_dataset.hpp"
#include "lattice/parallel/pipeline/stage_partition.hpp"
#include "lattice/parallel/replica/outer_optimizer.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

namespace {

// [data]: the token-file format is known, the tokenizer is an absolute path (so `lattice generate`
// finds it from a run's config.toml), and a prepared dataset's tokenizer is the configured one.
void resolve_data_keys(TrainConfig& c) {
  const auto format = data::parse_token_format(c.data.format);
  c.data.tokenizer = data::absolute_tokenizer_spec(c.data.tokenizer);
  if (c.data.dataset.empty()) {
    check(c.data.tokenizer == "byte",
          "data.tokenizer '" + c.data.tokenizer +
              "' needs token files: run `lattice data prepare --tokenizer ...` and set "
              "data.dataset to its output (data.train_files is read as bytes)");
    return;
  }
  // A missing dataset is reported when the data is opened (generation never opens it).
  const bool prepared =
      format != data::TokenFormat::llmc && format != data::TokenFormat::megatron &&
      std::filesystem::exists(std::filesystem::path(c.data.dataset) / data::kManifestName);
  if (!prepared) return;
  const auto manifest = data::read_manifest(c.data.dataset);
  if (c.data.tokenizer == "byte") {
    c.data.tokenizer = manifest.tokenizer;  // the dataset's own tokenizer unless one is configured
  } else {
    check(c.data.tokenizer == manifest.tokenizer,
          "data.tokenizer '" + c.data.tokenizer + "' is not the tokenizer data.dataset '" +
              c.data.dataset + "' was prepared with ('" + manifest.tokenizer +
              "'): drop data.tokenizer or set it to that path");
  }
}

// Models the planner describes but this trainer does not build yet.
void refuse_unbuilt_model(const model::ModelConfig& m) {
  check(!m.has_dropout(), "model.dropout = " + std::to_string(m.dropout) +
                              " is not available yet: the trainer has no dropout; set "
                              "model.dropout = 0");
}

// Tensor parallelism splits the key/value heads over the tp ranks: the validator (shared with the
// planner) also lets a tp above the key/value heads replicate them, as Megatron can, but the
// trainer splits them. (The attention heads and the MLP width are the validator's.)
void refuse_tensor_parallel_misfit(const TrainConfig& c) {
  if (c.parallelism.tp <= 1) return;
  const std::string tp = "parallelism.tp = " + std::to_string(c.parallelism.tp);
  check(c.model.n_kv_heads % c.parallelism.tp == 0,
        tp + " does not divide the " + std::to_string(c.model.n_kv_heads) +
            " key/value heads (model.n_kv_heads): each tp rank holds its share of them; pick a "
            "tp that divides " +
            std::to_string(c.model.n_kv_heads));
}

// MoE layers: on Llama blocks (issue #24).
void refuse_moe_misfit(const TrainConfig& c) {
  if (!c.model.is_moe()) return;
  const model::Family f = c.model.family;
  check(f == model::Family::llama || f == model::Family::mistral || f == model::Family::qwen3 ||
            f == model::Family::deepseek,
        "model.n_experts = " + std::to_string(c.model.n_experts) +
            ": MoE layers are built on Llama, Mistral, Qwen 3 and DeepSeek blocks; set "
            "model.family = \"llama\" (or use a MoE preset: mixtral-tiny, deepseek-moe-tiny, "
            "qwen3-moe-tiny, deepseek-v3-tiny)");
  check(c.model.moe_bias_update_rate == 0 || c.parallelism.zero < 3,
        "model.moe_bias_update_rate with parallelism.zero = 3 is not available yet: the bias is "
        "updated between steps on the whole parameters; use ZeRO 0-2");
}

// Context parallelism: the sequence in 2·cp equal chunks, Ulysses' heads divisible by cp, and
// under sequence parallelism each rank's T / cp rows divisible by tp.
void refuse_context_parallel_misfit(const TrainConfig& c) {
  if (c.parallelism.cp <= 1) return;
  parallel::check_context_parallel(c.context_parallel.mode, static_cast<int>(c.parallelism.cp),
                                   static_cast<int>(c.parallelism.tp), c.training.seq_len,
                                   c.model.n_heads, c.model.n_kv_heads);
  check(!c.parallelism.sequence_parallel ||
            (c.training.seq_len / c.parallelism.cp) % c.parallelism.tp == 0,
        "parallelism.sequence_parallel splits each cp rank's " +
            std::to_string(c.training.seq_len / c.parallelism.cp) +
            " tokens (training.seq_len / cp) over parallelism.tp = " +
            std::to_string(c.parallelism.tp) +
            " ranks, which does not divide them: pick a seq_len divisible by cp x tp x 2");
}

// The pipeline keys: the schedule's name, its virtual stages (0: the schedule's own, 2 for the
// interleaved and V schedules, else 1), the partition, and what pipelines cannot do yet.
void resolve_pipeline_keys(TrainConfig& c) {
  const pipeline::ScheduleKind kind =
      pipeline::parse_schedule_kind(c.parallelism.pipeline_schedule);
  check(c.parallelism.virtual_stages >= 0,
        "parallelism.virtual_stages must not be negative (0: the "
        "schedule's own: 2 for interleaved and zb-v, else 1)");
  if (c.parallelism.virtual_stages == 0)
    c.parallelism.virtual_stages =
        kind == pipeline::ScheduleKind::kInterleaved || kind == pipeline::ScheduleKind::kZeroBubbleV
            ? 2
            : 1;
  check(
      c.parallelism.pipeline_partition == "even" || c.parallelism.pipeline_partition == "balanced",
      "parallelism.pipeline_partition '" + c.parallelism.pipeline_partition +
          "' is unknown: use \"even\" or \"balanced\" (or list the blocks per stage in "
          "parallelism.pipeline_layers)");
  if (c.parallelism.pp == 1) {
    check(c.parallelism.pipeline_layers.empty() && c.parallelism.pipeline_schedule_file.empty(),
          "parallelism.pipeline_layers and pipeline_schedule_file need pp > 1: set parallelism.pp "
          "or remove them");
    return;
  }
  check(c.parallelism.pipeline_layers.empty() ||
            static_cast<int64_t>(c.parallelism.pipeline_layers.size()) ==
                c.parallelism.pp * c.parallelism.virtual_stages,
        "parallelism.pipeline_layers lists " +
            std::to_string(c.parallelism.pipeline_layers.size()) +
            " stages, the pipeline has pp x virtual_stages = " +
            std::to_string(c.parallelism.pp * c.parallelism.virtual_stages) +
            ": list one block count per stage");
  check(c.parallelism.zero < 3,
        "parallelism.zero = 3 with pp > 1 is refused: ZeRO-3 would gather every stage's weights "
        "again for each microbatch's forward and backward (m times the traffic of a step, as "
        "DeepSpeed also refuses); use zero 1 or 2 with a pipeline");
  if (!c.parallelism.pipeline_schedule_file.empty()) {
    check(std::filesystem::exists(c.parallelism.pipeline_schedule_file),
          "parallelism.pipeline_schedule_file " + c.parallelism.pipeline_schedule_file +
              " does not exist: check the path");
    c.parallelism.pipeline_schedule_file =
        std::filesystem::absolute(c.parallelism.pipeline_schedule_file).string();
  }
}

}  // namespace

// [replica] and [diloco]: one line per impossible value.
static void check_replica_keys(const TrainConfig& c) {
  const ReplicaConfig& r = c.replica;
  check(r.groups >= 1, "replica.groups must be at least 1 (1: no replica groups)");
  check(r.group >= 0 && r.group < r.groups,
        "replica.group = " + std::to_string(r.group) + " is not a group of replica.groups = " +
            std::to_string(r.groups) + ": use 0 .. " + std::to_string(r.groups - 1));
  check(c.diloco.inner_steps >= 0, "diloco.inner_steps must not be negative (0: DiLoCo off)");
  check(r.groups == 1 || c.diloco.inner_steps > 0 || c.parallelism.pp == 1,
        "synchronous replica groups (replica.groups > 1, diloco.inner_steps = 0) with a pipeline "
        "are not built yet: set parallelism.pp = 1, or use DiLoCo (diloco.inner_steps > 0)");
  check(r.groups == 1 || !r.store.empty(),
        "replica.groups = " + std::to_string(r.groups) +
            " needs replica.store, the host:port of the etcd the groups meet at (start one with "
            "`etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls "
            "http://127.0.0.1:2379`)");
  check(r.timeout_seconds > 0 && r.timeout_seconds <= 86400,
        "replica.timeout_seconds must be in (0, 86400]");
  check(!r.job.empty() && r.job.find('/') == std::string::npos,
        "replica.job must be a non-empty name without '/'");
  check(r.groups == 1 || !r.host.empty(), "replica.host must name this group's address");
  check(r.lease_seconds >= 2 && r.lease_seconds <= 3600,
        "replica.lease_seconds must be in [2, 3600] (etcd grants no shorter lease)");
  check(r.min_groups >= 1 && r.min_groups <= r.groups,
        "replica.min_groups = " + std::to_string(r.min_groups) +
            " must be in 1 .. replica.groups = " + std::to_string(r.groups));
  check(r.groups == 1 || c.parallelism.offload_dir.empty(),
        "replica groups hand their optimizer state to a joining group from memory: drop "
        "parallelism.offload_dir, or run one group (replica.groups = 1)");
  const DilocoConfig& d = c.diloco;
  if (d.streaming()) {
    check(d.inner_steps > 0,
          "diloco.fragments, overlap_steps and exchange are Streaming DiLoCo's: they need "
          "diloco.inner_steps > 0");
    const int64_t layers = c.model.n_layers + 2;  // the embedding, the blocks, the head
    check(d.fragments >= 1 && d.fragments <= layers,
          "diloco.fragments = " + std::to_string(d.fragments) + " must be in 1 .. " +
              std::to_string(layers) + " (the model's layers: embedding, blocks and head)");
    check(d.inner_steps % d.fragments == 0,
          "diloco.inner_steps = " + std::to_string(d.inner_steps) +
              " must be a multiple of diloco.fragments = " + std::to_string(d.fragments) +
              " (each fragment is synchronised every inner_steps steps, one every inner_steps / "
              "fragments)");
    check(d.overlap_steps >= 0 && d.overlap_steps < d.inner_steps / d.fragments,
          "diloco.overlap_steps = " + std::to_string(d.overlap_steps) + " must be in 0 .. " +
              std::to_string(d.inner_steps / d.fragments - 1) +
              " (below inner_steps / fragments: one fragment in flight at a time)");
  }
  check(d.mixing >= 0 && d.mixing <= 1, "diloco.mixing must be in [0, 1] (the paper's 0.5)");
  if (c.diloco.inner_steps > 0)
    replica::validate(replica::OuterSettings{static_cast<float>(c.diloco.outer_lr),
                                             static_cast<float>(c.diloco.outer_momentum),
                                             c.diloco.nesterov});
}

void TrainConfig::finalize() {
  // metrics.trace_steps = "a:b" (1 <= a <= b); without it a trace covers steps 1 to 50.
  if (!metrics.trace_steps.empty()) {
    long long first = 0, last = 0;
    char tail = 0;
    check(std::sscanf(metrics.trace_steps.c_str(), "%lld:%lld%c", &first, &last, &tail) == 2 &&
              first >= 1 && last >= first,
          "metrics.trace_steps = \"" + metrics.trace_steps +
              "\" is not a:b with 1 <= a <= b: name the steps to trace, e.g. \"10:12\"");
    metrics.trace_first = first;
    metrics.trace_last = last;
    if (metrics.trace.empty())
      metrics.trace = (std::filesystem::path(job.run_dir) / "trace.json").string();
  }
  model.validate();
  refuse_unbuilt_model(model);
  // dp = -1: the rest of the launcher's world (one rank without a launcher) once tp x pp x cp is
  // taken; the mesh's resolution names the keys when the world does not divide.
  if (parallelism.dp == -1) {
    mesh::MeshShape requested = layout().mesh_shape();
    requested.dp = -1;
    parallelism.dp = mesh::resolve_layout(requested, comm::detect_launch().world_size).dp;
  }
  check(parallelism.dp >= 1,
        "parallelism.dp = " + std::to_string(parallelism.dp) +
            " is not a rank count: use a positive number, or -1 for the launcher's world size");
  check(parallelism.bucket_mb > 0 && parallelism.bucket_mb <= 4096,
        "parallelism.bucket_mb = " + std::to_string(parallelism.bucket_mb) +
            " must be in (0, 4096] MiB (25 is a good default)");
  check(parallelism.backend == "auto" || parallelism.backend == "local" ||
            parallelism.backend == "mpi",
        "parallelism.backend '" + parallelism.backend +
            "' is unknown: use \"auto\", \"local\" or \"mpi\"");
  check(parallelism.baseline_tokens_per_second >= 0,
        "parallelism.baseline_tokens_per_second must not be negative (0: no scaling efficiency)");
  resolve_data_keys(*this);
  check(training.steps > 0, "training.steps must be positive");
  check(training.seq_len > 0 && training.seq_len <= model.max_seq_len,
        "training.seq_len (" + std::to_string(training.seq_len) +
            ") must be in [1, model.max_seq_len = " + std::to_string(model.max_seq_len) +
            "]: lower it or raise model.max_seq_len");
  check(optimizer.lr > 0, "optimizer.lr must be positive");
  check(metrics.log_freq > 0, "metrics.log_freq must be positive");
  check(lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps must not be negative");
  check(training.threads >= 0, "training.threads must not be negative (0 uses every core)");
  check(training.activation_memory_limit_mb >= 0,
        "training.activation_memory_limit_mb must not be negative (0: no limit)");
  check(validation.freq >= 0 && validation.batches > 0,
        "validation.freq must be >= 0 (0 disables) and validation.batches positive");
  check_replica_keys(*this);
  check(checkpoint.interval >= 0 && checkpoint.keep_latest >= 1,
        "checkpoint.interval must be >= 0 and checkpoint.keep_latest >= 1");
  // Batch: two of micro, global and accumulation decide the third (with dp ranks in between).
  int given = (training.micro_batch_size > 0) + (training.global_batch_size > 0) +
              (training.gradient_accumulation_steps > 0);
  for (auto [name, value] : {std::pair{"micro_batch_size", training.micro_batch_size},
                             {"global_batch_size", training.global_batch_size},
                             {"gradient_accumulation_steps", training.gradient_accumulation_steps}})
    check(value >= 0, std::string("training.") + name + " must be positive");
  if (given == 0) training.micro_batch_size = 8;
  if (given <= 1 && training.gradient_accumulation_steps == 0 && training.global_batch_size == 0)
    training.gradient_accumulation_steps = 1;
  if (training.global_batch_size == 0) {
    if (training.micro_batch_size == 0) training.micro_batch_size = 8;
    training.global_batch_size =
        training.micro_batch_size * training.gradient_accumulation_steps * parallelism.dp;
  } else if (training.micro_batch_size == 0) {
    if (training.gradient_accumulation_steps == 0) training.gradient_accumulation_steps = 1;
    check(training.global_batch_size % (training.gradient_accumulation_steps * parallelism.dp) == 0,
          "training.global_batch_size (" + std::to_string(training.global_batch_size) +
              ") is not divisible by gradient_accumulation_steps × dp (" +
              std::to_string(training.gradient_accumulation_steps * parallelism.dp) +
              "): change one of them");
    training.micro_batch_size =
        training.global_batch_size / (training.gradient_accumulation_steps * parallelism.dp);
  } else if (training.gradient_accumulation_steps == 0) {
    check(training.global_batch_size % (training.micro_batch_size * parallelism.dp) == 0,
          "training.global_batch_size (" + std::to_string(training.global_batch_size) +
              ") is not divisible by micro_batch_size × dp (" +
              std::to_string(training.micro_batch_size * parallelism.dp) + "): change one of them");
    training.gradient_accumulation_steps =
        training.global_batch_size / (training.micro_batch_size * parallelism.dp);
  }
  check(training.global_batch_size ==
            training.micro_batch_size * training.gradient_accumulation_steps * parallelism.dp,
        "training.global_batch_size (" + std::to_string(training.global_batch_size) +
            ") must equal micro_batch_size (" + std::to_string(training.micro_batch_size) +
            ") × gradient_accumulation_steps (" +
            std::to_string(training.gradient_accumulation_steps) + ") × dp (" +
            std::to_string(parallelism.dp) + "): give only two of the three");
  resolve_pipeline_keys(*this);
  // The one layout check the planner runs too, then what this trainer cannot run yet.
  parallel::validate_layout(model, training.seq_len, layout());
  if (!parallelism.pipeline_layers.empty())
    pipeline::listed_partition(parallelism.pipeline_layers,
                               model.n_layers);  // its one-line refusals
  refuse_tensor_parallel_misfit(*this);
  refuse_context_parallel_misfit(*this);
  refuse_moe_misfit(*this);
}

}  // namespace lattice::train
