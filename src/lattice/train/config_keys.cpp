// The training config's keys (config_schema.hpp): each key's section, codec and one-line help, in
// the order `lattice train --help-config` and docs/training.md list them. Defaults are not here:
// they are TrainConfig's own (train_config.hpp), rendered when asked for.
#include <string>
#include <vector>

#include "lattice/train/config_key_builders.hpp"

namespace lattice::train {

namespace {

using namespace config_detail;
using model::ModelConfig;
using optim::AdamWSettings;

// The model preset's help names the first of the preset table's models, and how many there are.
std::string preset_help() {
  const std::vector<std::string> names = model::model_preset_names();
  std::string first;
  for (size_t i = 0; i < names.size() && i < 7; ++i) first += (i ? ", " : "") + names[i];
  return "one of " + std::to_string(names.size()) + " named models (" + first +
         ", ...; an unknown name lists them all; `lattice estimate` takes the same names), applied "
         "before the other model keys";
}

KeyCodec preset_codec() {
  return {"string",
          [](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model_preset = as_string(n, k);
            c.model = model::model_preset(c.model_preset);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.model_preset);
          }};
}

// Unset: dropless routing; nothing is written back then.
KeyCodec capacity_factor_codec() {
  return {"number",
          [](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.moe_capacity_factor = as_double(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            if (c.model.moe_capacity_factor) t.insert_or_assign(name, *c.model.moe_capacity_factor);
          }};
}

// yarn's attention factor: unset (from the factor, mscale and mscale_all_dim); nothing is written
// back then.
KeyCodec rope_attention_factor_codec() {
  return {"number",
          [](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.rope_scaling.attention_factor = as_double(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            if (c.model.rope_scaling.attention_factor)
              t.insert_or_assign(name, *c.model.rope_scaling.attention_factor);
          }};
}

// AdamW is the one optimizer: the key is checked and always written as "AdamW".
KeyCodec optimizer_name_codec() {
  return {"string",
          [](TrainConfig&, const toml::node& n, const std::string& k) {
            check(as_string(n, k) == "AdamW",
                  "optimizer.name '" + as_string(n, k) + "' is not available: use \"AdamW\"");
          },
          [](const TrainConfig&, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, "AdamW");
          }};
}

template <class... Members>
auto model_field(Members... members) {
  return field(&TrainConfig::model, members...);
}
template <class... Members>
auto rope_field(Members... members) {
  return field(&TrainConfig::model, &ModelConfig::rope_scaling, members...);
}
template <class... Members>
auto adamw_field(Members... members) {
  return field(&TrainConfig::optimizer, &OptimizerConfig::adamw, members...);
}

std::vector<ConfigKey> build_keys() {
  std::vector<ConfigKey> keys;
  auto add = [&keys](const char* section, const char* name, KeyCodec codec, std::string help) {
    keys.push_back({section, name, std::move(codec.type), std::move(help), std::move(codec.set),
                    std::move(codec.get)});
  };
  auto precision = [](const std::string& s) { return kernels::parse_precision(s); };
  auto precision_name = [](kernels::Precision p) { return kernels::precision_name(p); };

  add("job", "run_dir", string_key(field(&TrainConfig::job, &JobConfig::run_dir)),
      "where config.toml, metrics.jsonl, TensorBoard events and checkpoints/ go");
  add("job", "description", string_key(field(&TrainConfig::job, &JobConfig::description)),
      "free text");

  add("model", "preset", preset_codec(), preset_help());
  add("model", "family",
      enum_key(model_field(&ModelConfig::family), model::parse_family, model::family_name),
      "gpt2 (learned positions, LayerNorm, GELU, biases), llama (RMSNorm, RoPE, SwiGLU, GQA, "
      "no biases), mistral (llama, saved with its sliding window), qwen2 (llama with q/k/v "
      "biases), qwen3 (llama with per-head q/k RMSNorm) or deepseek (llama with multi-head latent "
      "attention when kv_lora_rank > 0); from the preset");
  add("model", "vocab_size", int_key(model_field(&ModelConfig::vocab_size)),
      "vocabulary (>= 256 with the byte tokenizer); from the preset");
  add("model", "max_seq_len", int_key(model_field(&ModelConfig::max_seq_len)),
      "longest sequence: learned positions (GPT-2) or the RoPE table (Llama); from the preset");
  add("model", "d_model", int_key(model_field(&ModelConfig::d_model)),
      "hidden width, a multiple of n_heads unless head_dim is set; from the preset");
  add("model", "n_layers", int_key(model_field(&ModelConfig::n_layers)),
      "transformer blocks; from the preset");
  add("model", "n_heads", int_key(model_field(&ModelConfig::n_heads)),
      "attention heads; from the preset");
  add("model", "n_kv_heads", int_key(model_field(&ModelConfig::n_kv_heads)),
      "key/value heads (grouped-query attention), dividing n_heads; from the preset");
  add("model", "head_dim", int_key(model_field(&ModelConfig::explicit_head_dim)),
      "each attention head's width when it is not d_model / n_heads (Qwen 3: 128); 0: d_model / "
      "n_heads; from the preset");
  add("model", "sliding_window", int_key(model_field(&ModelConfig::sliding_window)),
      "positions each query sees, itself included (Mistral: 4096); 0: all earlier ones; RoPE "
      "families; from the preset");
  add("model", "q_lora_rank", int_key(model_field(&ModelConfig::q_lora_rank)),
      "multi-head latent attention (deepseek): the query's low rank (DeepSeek-V3: 1536); 0: one "
      "q_proj; from the preset");
  add("model", "kv_lora_rank", int_key(model_field(&ModelConfig::kv_lora_rank)),
      "multi-head latent attention's compressed key/value width (DeepSeek-V3: 512); > 0 turns it "
      "on (family deepseek; tp dividing n_heads); 0: none; from the preset");
  add("model", "qk_nope_head_dim", int_key(model_field(&ModelConfig::qk_nope_head_dim)),
      "multi-head latent attention: each query/key head's channels without RoPE (DeepSeek-V3: "
      "128); from the preset");
  add("model", "qk_rope_head_dim", int_key(model_field(&ModelConfig::qk_rope_head_dim)),
      "multi-head latent attention: each query/key head's RoPE channels, even (DeepSeek-V3: 64); "
      "from the preset");
  add("model", "v_head_dim", int_key(model_field(&ModelConfig::v_head_dim)),
      "multi-head latent attention: each value head's width (DeepSeek-V3: 128); from the preset");
  add("model", "ffn_hidden", int_key(model_field(&ModelConfig::ffn_hidden)),
      "MLP inner width (GPT-2: 4 x d_model; Llama: the SwiGLU width); from the preset");
  add("model", "norm_eps", number_key(model_field(&ModelConfig::norm_eps)),
      "LayerNorm / RMSNorm epsilon; from the preset");
  add("model", "rope_theta", number_key(model_field(&ModelConfig::rope_theta)),
      "RoPE base (Llama); from the preset");
  add("model", "rope_type",
      enum_key(rope_field(&kernels::RopeScaling::type), kernels::parse_rope_type,
               kernels::rope_type_name),
      "RoPE scaling as transformers' rope_type: default (none), linear, dynamic (NTK, computed for "
      "max_seq_len), llama3 (Llama 3.1+) or yarn; the rope_* keys below are its parameters");
  add("model", "rope_factor", number_key(rope_field(&kernels::RopeScaling::factor)),
      "RoPE scaling factor: the context extension ratio (linear, dynamic, llama3, yarn)");
  add("model", "rope_original_max_position_embeddings",
      int_key(rope_field(&kernels::RopeScaling::original_max_positions)),
      "the pre-training context of llama3 and yarn; dynamic: the length beyond which the base "
      "grows (0: unset)");
  add("model", "rope_low_freq_factor",
      number_key(rope_field(&kernels::RopeScaling::low_freq_factor)),
      "llama3: wavelengths above original / low_freq_factor are divided by the factor");
  add("model", "rope_high_freq_factor",
      number_key(rope_field(&kernels::RopeScaling::high_freq_factor)),
      "llama3: wavelengths below original / high_freq_factor are kept; a smooth ramp between");
  add("model", "rope_beta_fast", number_key(rope_field(&kernels::RopeScaling::beta_fast)),
      "yarn: rotations bounding the extrapolated dimensions");
  add("model", "rope_beta_slow", number_key(rope_field(&kernels::RopeScaling::beta_slow)),
      "yarn: rotations bounding the interpolated dimensions");
  add("model", "rope_attention_factor", rope_attention_factor_codec(),
      "yarn: cos and sin times this (unset: from factor, mscale and mscale_all_dim, 0.1 ln(factor) "
      "+ 1 without them)");
  add("model", "rope_mscale", number_key(rope_field(&kernels::RopeScaling::mscale)),
      "yarn: with rope_mscale_all_dim, the attention factor is mscale(factor, mscale) / "
      "mscale(factor, mscale_all_dim) (0: unset)");
  add("model", "rope_mscale_all_dim", number_key(rope_field(&kernels::RopeScaling::mscale_all_dim)),
      "yarn: see rope_mscale; the deepseek family's softmax scale is also multiplied by "
      "mscale(factor, mscale_all_dim)^2 (0: unset)");
  add("model", "rope_truncate", bool_key(rope_field(&kernels::RopeScaling::truncate)),
      "yarn: round the correction range to whole dimensions");
  add("model", "init_std", number_key(model_field(&ModelConfig::init_std)),
      "standard deviation of the initial weights; from the preset");
  add("model", "tied_embeddings", bool_key(model_field(&ModelConfig::tied_embeddings)),
      "the head shares the token embedding's weights (GPT-2); from the preset");
  add("model", "n_experts", int_key(model_field(&ModelConfig::n_experts)),
      "routed experts per MoE layer, Llama, Mistral and Qwen 3 families (1: dense); see "
      "docs/moe.md");
  add("model", "top_k", int_key(model_field(&ModelConfig::top_k)),
      "experts each token is routed to");
  add("model", "moe_layer_interval", int_key(model_field(&ModelConfig::moe_layer_interval)),
      "layer i is a MoE layer when (i + 1) % interval == 0; the others keep a dense MLP");
  add("model", "moe_first_dense_layers", int_key(model_field(&ModelConfig::moe_first_dense_layers)),
      "layers below this keep a dense MLP of ffn_hidden (DeepSeek's first_k_dense_replace: 3); 0: "
      "none");
  add("model", "moe_ffn_hidden", int_key(model_field(&ModelConfig::moe_ffn_hidden)),
      "each routed expert's MLP width (0: ffn_hidden)");
  add("model", "moe_shared_experts", int_key(model_field(&ModelConfig::moe_shared_experts)),
      "always-on shared experts (DeepSeek): one SwiGLU of that many expert widths");
  add("model", "moe_score",
      enum_key(model_field(&ModelConfig::moe_score), model::parse_router_score,
               model::router_score_name),
      "router scores: softmax or sigmoid");
  add("model", "moe_normalize", bool_key(model_field(&ModelConfig::moe_normalize)),
      "renormalise the chosen experts' scores to sum to 1");
  add("model", "moe_scaling", number_key(model_field(&ModelConfig::moe_scaling)),
      "every routed weight times this (DeepSeek-V3: 2.5)");
  add("model", "moe_capacity_factor", capacity_factor_codec(),
      "unset: dropless; else each expert keeps ceil(factor x tokens x top_k / experts) copies of "
      "a rank's micro-batch (> 0)");
  add("model", "moe_aux_loss_coef", number_key(model_field(&ModelConfig::moe_aux_loss_coef)),
      "coefficient of the Switch/GShard load-balancing loss (loads summed over dp x cp)");
  add("model", "moe_z_loss_coef", number_key(model_field(&ModelConfig::moe_z_loss_coef)),
      "coefficient of the router z-loss (ST-MoE)");
  add("model", "moe_bias_update_rate", number_key(model_field(&ModelConfig::moe_bias_update_rate)),
      "auxiliary-loss-free balancing (DeepSeek-V3): each expert's choice bias moves this much per "
      "step towards balance (0: none; not with ZeRO-3)");
  add("model", "moe_choice_bias", bool_key(model_field(&ModelConfig::moe_choice_bias)),
      "keep the per-expert choice bias (e_score_correction_bias) even at update rate 0, held "
      "fixed (an imported DeepSeek-V3's); implied by moe_bias_update_rate > 0");
  add("model", "moe_groups", int_key(model_field(&ModelConfig::moe_groups)),
      "group-limited routing (DeepSeek-V3's n_group: 8): experts in this many equal groups, each "
      "scored by its two best choice scores (1: none)");
  add("model", "moe_top_groups", int_key(model_field(&ModelConfig::moe_top_groups)),
      "the groups a token may route to, its best by group score (DeepSeek-V3's topk_group: 4)");
  add("model", "moe_activation",
      enum_key(model_field(&ModelConfig::moe_activation), model::parse_moe_activation,
               model::moe_activation_name),
      "routed experts' MLP: swiglu (gate, up, down) or gelu (two matrices); shared experts stay "
      "SwiGLU");
  add("model", "moe_names",
      enum_key(model_field(&ModelConfig::moe_names), model::parse_moe_names, model::moe_names_name),
      "MoE parameter names: mixtral (block_sparse_moe.*) or deepseek (mlp.experts.*, also "
      "Qwen-MoE's)");
  add("model", "dropout", number_key(model_field(&ModelConfig::dropout)),
      "refused above 0: the trainer has no dropout yet (the planner counts its masks)");

  add("training", "seed", int_key(field(&TrainConfig::training, &TrainingConfig::seed)),
      "initial weights and data order");
  add("training", "steps", int_key(field(&TrainConfig::training, &TrainingConfig::steps)),
      "optimizer steps (> 0)");
  add("training", "seq_len", int_key(field(&TrainConfig::training, &TrainingConfig::seq_len)),
      "tokens per sequence (<= model.max_seq_len)");
  add("training", "micro_batch_size",
      int_key(field(&TrainConfig::training, &TrainingConfig::micro_batch_size)),
      "sequences per rank per micro-batch; give two of the three batch keys (0: derived; 8 when "
      "none is given)");
  add("training", "global_batch_size",
      int_key(field(&TrainConfig::training, &TrainingConfig::global_batch_size)),
      "sequences per step = micro_batch_size x gradient_accumulation_steps x dp (0: derived)");
  add("training", "gradient_accumulation_steps",
      int_key(field(&TrainConfig::training, &TrainingConfig::gradient_accumulation_steps)),
      "micro-batches per step, also the pipeline's microbatches (0: derived; 1 when at most one "
      "batch key is given)");
  add("training", "precision",
      enum_key(field(&TrainConfig::training, &TrainingConfig::precision), precision,
               precision_name),
      "fp32, or bf16: GEMM and attention inputs in bf16 with fp32 accumulation, fp32 master "
      "weights and optimizer state (autocast's recipe)");
  add("training", "max_norm", number_key(adamw_field(&AdamWSettings::max_grad_norm)),
      "global gradient-norm clipping (<= 0 disables)");
  add("training", "threads", int_key(field(&TrainConfig::training, &TrainingConfig::threads)),
      "kernel threads (0: every core)");
  add("training", "activation_memory_limit_mb",
      number_key(field(&TrainConfig::training, &TrainingConfig::activation_memory_limit_mb)),
      "refuse the run before it allocates when its estimated activation memory per rank exceeds "
      "this many MiB (0: no limit)");

  add("optimizer", "name", optimizer_name_codec(), "AdamW (the one optimizer)");
  add("optimizer", "lr", number_key(field(&TrainConfig::optimizer, &OptimizerConfig::lr)),
      "peak learning rate (> 0)");
  add("optimizer", "beta1", number_key(adamw_field(&AdamWSettings::beta1)), "AdamW beta1");
  add("optimizer", "beta2", number_key(adamw_field(&AdamWSettings::beta2)), "AdamW beta2");
  add("optimizer", "eps", number_key(adamw_field(&AdamWSettings::eps)), "AdamW epsilon");
  add("optimizer", "weight_decay", number_key(adamw_field(&AdamWSettings::weight_decay)),
      "decoupled weight decay, on matrices and embeddings only");

  add("lr_scheduler", "warmup_steps",
      int_key(field(&TrainConfig::lr_scheduler, &LrSchedulerConfig::warmup_steps)),
      "steps of linear warmup to optimizer.lr");
  add("lr_scheduler", "decay",
      enum_key(field(&TrainConfig::lr_scheduler, &LrSchedulerConfig::decay), optim::parse_decay,
               optim::decay_name),
      "after warmup: cosine or linear down to lr x min_lr_ratio at the last step, or constant");
  add("lr_scheduler", "min_lr_ratio",
      number_key(field(&TrainConfig::lr_scheduler, &LrSchedulerConfig::min_lr_ratio)),
      "the final learning rate as a fraction of optimizer.lr");

  add("parallelism", "dp", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::dp)),
      "data-parallel ranks (-1: the rest of the launcher's world); the world is dp x tp x pp x cp");
  add("parallelism", "tp", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::tp)),
      "tensor-parallel ranks (dividing the heads, key/value heads and MLP width)");
  add("parallelism", "sequence_parallel",
      bool_key(field(&TrainConfig::parallelism, &ParallelismConfig::sequence_parallel)),
      "with tp > 1: norms and residuals on each rank's share of the sequence rows");
  add("parallelism", "pp", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::pp)),
      "pipeline stages' ranks");
  add("parallelism", "pipeline_schedule",
      string_key(field(&TrainConfig::parallelism, &ParallelismConfig::pipeline_schedule)),
      "with pp > 1: gpipe, 1f1b, interleaved, zb-h1 or zb-v");
  add("parallelism", "virtual_stages",
      int_key(field(&TrainConfig::parallelism, &ParallelismConfig::virtual_stages)),
      "virtual stages per pipeline rank (0: the schedule's own, 2 for interleaved and zb-v, else "
      "1)");
  add("parallelism", "pipeline_layers",
      int_list_key(field(&TrainConfig::parallelism, &ParallelismConfig::pipeline_layers)),
      "blocks of each virtual stage, pp x virtual_stages counts (empty: by pipeline_partition)");
  add("parallelism", "pipeline_partition",
      string_key(field(&TrainConfig::parallelism, &ParallelismConfig::pipeline_partition)),
      "even (equal block counts) or balanced (by cost), when pipeline_layers is empty");
  add("parallelism", "pipeline_schedule_file",
      string_key(field(&TrainConfig::parallelism, &ParallelismConfig::pipeline_schedule_file)),
      "a schedule (JSON or CSV action lists) that replaces the generated one");
  add("parallelism", "cp", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::cp)),
      "context-parallel ranks: each holds 2 of 2 x cp sequence chunks (see [context_parallel])");
  add("parallelism", "ep", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::ep)),
      "expert-parallel ranks, carved out of dp x cp (adding none): a MoE model's experts split "
      "over them");
  add("parallelism", "zero", int_key(field(&TrainConfig::parallelism, &ParallelismConfig::zero)),
      "ZeRO stage 0-3: shard optimizer state (1), gradients (2) and weights (3) over dp");
  add("parallelism", "bucket_mb",
      number_key(field(&TrainConfig::parallelism, &ParallelismConfig::bucket_mb)),
      "gradient bucket size in MiB of fp32 gradients, in (0, 4096]");
  add("parallelism", "check_replicas",
      bool_key(field(&TrainConfig::parallelism, &ParallelismConfig::check_replicas)),
      "verify after each step that replicated parameters agree");
  add("parallelism", "backend",
      string_key(field(&TrainConfig::parallelism, &ParallelismConfig::backend)),
      "auto (mpi under a launcher, else local threads), local or mpi");
  add("parallelism", "baseline_tokens_per_second",
      number_key(field(&TrainConfig::parallelism, &ParallelismConfig::baseline_tokens_per_second)),
      "single-rank tokens/s for the data-parallel scaling efficiency (0: none)");
  add("parallelism", "hsdp_shard_size",
      int_key(field(&TrainConfig::parallelism, &ParallelismConfig::hsdp_shard_size)),
      "HSDP: shard the ZeRO state within groups of this many dp ranks (0: all of dp)");
  add("parallelism", "offload_dir",
      string_key(field(&TrainConfig::parallelism, &ParallelismConfig::offload_dir)),
      "keep the AdamW moments in files under <dir>/rank<r> (empty: in memory)");

  add("context_parallel", "mode",
      enum_key(field(&TrainConfig::context_parallel, &ContextParallelConfig::mode),
               parallel::parse_context_parallel_mode, parallel::context_parallel_mode_name),
      "with cp > 1: ring (ring attention) or ulysses (all-to-all to head shards)");

  add("activation_checkpoint", "mode",
      enum_key(field(&TrainConfig::activation_checkpoint, &model::ActivationCheckpoint::mode),
               model::parse_recompute, model::recompute_name),
      "none; selective (attention output and log-sum-exp recomputed); full (every interval-th "
      "block keeps only its input); losses identical either way");
  add("activation_checkpoint", "interval",
      int_key(field(&TrainConfig::activation_checkpoint, &model::ActivationCheckpoint::interval)),
      "with mode = full: every interval-th block is recomputed");

  add("checkpoint", "enable", bool_key(field(&TrainConfig::checkpoint, &CheckpointConfig::enable)),
      "write checkpoints under <run_dir>/checkpoints");
  add("checkpoint", "interval",
      int_key(field(&TrainConfig::checkpoint, &CheckpointConfig::interval)),
      "steps between checkpoints (0: only at the end)");
  add("checkpoint", "keep_latest",
      int_key(field(&TrainConfig::checkpoint, &CheckpointConfig::keep_latest)),
      "checkpoints kept (>= 1); older ones are removed");
  add("checkpoint", "async", bool_key(field(&TrainConfig::checkpoint, &CheckpointConfig::async)),
      "write interval checkpoints from a snapshot in the background while training goes on (the "
      "final one is waited for)");
  add("checkpoint", "resume", bool_key(field(&TrainConfig::checkpoint, &CheckpointConfig::resume)),
      "resume from run_dir's latest checkpoint when there is one");
  add("checkpoint", "resume_from",
      string_key(field(&TrainConfig::checkpoint, &CheckpointConfig::resume_from)),
      "resume from this checkpoint or run directory instead");
  add("checkpoint", "init_from",
      string_key(field(&TrainConfig::checkpoint, &CheckpointConfig::init_from)),
      "fine-tune: start from this step-0 checkpoint or run directory (`lattice import`'s) when "
      "run_dir has none; the model settings are its own (no [model] keys)");

  add("metrics", "log_freq", int_key(field(&TrainConfig::metrics, &MetricsConfig::log_freq)),
      "steps between log lines (> 0; the first, last and validation steps always log)");
  add("metrics", "jsonl", bool_key(field(&TrainConfig::metrics, &MetricsConfig::jsonl)),
      "write every step to <run_dir>/metrics.jsonl");
  add("metrics", "tensorboard", bool_key(field(&TrainConfig::metrics, &MetricsConfig::tensorboard)),
      "TensorBoard event files in run_dir, the JSONL's numbers as scalars");
  add("metrics", "peak_tflops",
      number_key(field(&TrainConfig::metrics, &MetricsConfig::peak_tflops)),
      "the peak MFU divides by (0: measured by a short GEMM calibration at start)");
  add("metrics", "trace", string_key(field(&TrainConfig::metrics, &MetricsConfig::trace)),
      "write a Chrome trace of steps trace_steps (1:50 without them) to this file (empty: none "
      "unless trace_steps is set)");
  add("metrics", "trace_steps",
      string_key(field(&TrainConfig::metrics, &MetricsConfig::trace_steps)),
      "\"a:b\" with 1 <= a <= b: trace steps a to b (to <run_dir>/trace.json when trace is empty)");

  add("data", "train_files", string_list_key(field(&TrainConfig::data, &DataConfig::train_files)),
      "globs of text files read as bytes (vocabulary 256); not read when dataset is set");
  add("data", "exclude", string_list_key(field(&TrainConfig::data, &DataConfig::exclude)),
      "file-name patterns the train_files globs skip");
  add("data", "val_fraction", number_key(field(&TrainConfig::data, &DataConfig::val_fraction)),
      "the last fraction of the text held out for validation");
  add("data", "tokenizer", string_key(field(&TrainConfig::data, &DataConfig::tokenizer)),
      "byte, or a tokenizer path (needs token files in dataset; a prepared dataset's own by "
      "default)");
  add("data", "dataset", string_key(field(&TrainConfig::data, &DataConfig::dataset)),
      "token files: a `lattice data prepare` directory, llm.c shard globs or a Megatron prefix");
  add("data", "format", string_key(field(&TrainConfig::data, &DataConfig::format)),
      "format of dataset: auto, prepared, llmc or megatron");
  add("data", "val_dataset", string_key(field(&TrainConfig::data, &DataConfig::val_dataset)),
      "validation token files for llmc or megatron datasets (optional)");

  add("validation", "freq", int_key(field(&TrainConfig::validation, &ValidationConfig::freq)),
      "steps between validation losses (0 disables)");
  add("validation", "batches", int_key(field(&TrainConfig::validation, &ValidationConfig::batches)),
      "fixed validation batches averaged (> 0)");

  add("replica", "groups", int_key(field(&TrainConfig::replica, &ReplicaConfig::groups)),
      "replica groups of the job, each started on its own (1: none; > 1 needs diloco.inner_steps "
      "and replica.store)");
  add("replica", "group", int_key(field(&TrainConfig::replica, &ReplicaConfig::group)),
      "this process's group, 0 .. groups - 1 (`lattice train --replica-group G`)");
  add("replica", "store", string_key(field(&TrainConfig::replica, &ReplicaConfig::store)),
      "host:port of the etcd the groups meet at (its client URL, e.g. 127.0.0.1:2379)");
  add("replica", "host", string_key(field(&TrainConfig::replica, &ReplicaConfig::host)),
      "the address this group's ranks listen on for the other groups");
  add("replica", "job", string_key(field(&TrainConfig::replica, &ReplicaConfig::job)),
      "the job's name in the store (keys under /lattice/<job>/): the same in every group");
  add("replica", "timeout_seconds",
      number_key(field(&TrainConfig::replica, &ReplicaConfig::timeout_seconds)),
      "how long a group waits for a live but silent one (the start, every outer step and "
      "exchange) before it goes on without it");
  add("replica", "lease_seconds",
      int_key(field(&TrainConfig::replica, &ReplicaConfig::lease_seconds)),
      "a group's liveness lease in the store: a killed group is left out once it runs out (>= 2)");
  add("replica", "min_groups", int_key(field(&TrainConfig::replica, &ReplicaConfig::min_groups)),
      "the fewest live groups an outer step takes place with (fewer after the timeout: an error)");

  add("diloco", "inner_steps", int_key(field(&TrainConfig::diloco, &DilocoConfig::inner_steps)),
      "DiLoCo's H: steps between outer steps (0: off)");
  add("diloco", "outer_lr", number_key(field(&TrainConfig::diloco, &DilocoConfig::outer_lr)),
      "the outer SGD's learning rate (the paper's 0.7; 1 without momentum: plain averaging)");
  add("diloco", "outer_momentum",
      number_key(field(&TrainConfig::diloco, &DilocoConfig::outer_momentum)),
      "the outer SGD's momentum, in [0, 1)");
  add("diloco", "nesterov", bool_key(field(&TrainConfig::diloco, &DilocoConfig::nesterov)),
      "Nesterov momentum in the outer step (the paper's)");
  add("diloco", "fragments", int_key(field(&TrainConfig::diloco, &DilocoConfig::fragments)),
      "Streaming DiLoCo: fragments of the model (strided over the layers), one synchronised every "
      "inner_steps / fragments steps (1: the whole model at once)");
  add("diloco", "overlap_steps", int_key(field(&TrainConfig::diloco, &DilocoConfig::overlap_steps)),
      "Streaming DiLoCo's tau: inner steps a fragment's exchange runs behind, in [0, inner_steps "
      "/ fragments)");
  add("diloco", "mixing", number_key(field(&TrainConfig::diloco, &DilocoConfig::mixing)),
      "with overlap_steps > 0: the weight of the parameters trained during the exchange against "
      "its result, in [0, 1]");
  add("diloco", "exchange",
      enum_key(field(&TrainConfig::diloco, &DilocoConfig::exchange), replica::parse_outer_precision,
               replica::precision_name),
      "the outer gradients' precision between the groups: fp32 (the parameters' mean), bf16, or "
      "fp4 (E2M1 with a scale per 32 values)");
  return keys;
}

}  // namespace

const std::vector<ConfigSection>& config_sections() {
  static const std::vector<ConfigSection> sections = {
      {"job", "the run and where it writes"},
      {"model", "the architecture: a preset, then any of its values overridden"},
      {"training", "steps, batch, sequence length, precision and threads"},
      {"optimizer", "AdamW and its learning rate"},
      {"lr_scheduler", "warmup and decay of the learning rate"},
      {"parallelism", "the rank grid dp x tp x pp x cp (and ep), ZeRO, pipelines, the backend"},
      {"context_parallel", "how attention reaches the other cp ranks' keys"},
      {"activation_checkpoint", "what backward recomputes instead of keeping"},
      {"checkpoint", "writing checkpoints and resuming from them"},
      {"metrics", "log lines, metrics.jsonl, TensorBoard, MFU and traces"},
      {"data", "the training text or token files, and the tokenizer"},
      {"validation", "the held-out loss"},
      {"replica", "replica groups: the job's groups and where they meet"},
      {"diloco", "DiLoCo between replica groups: inner steps and the outer optimizer"},
  };
  return sections;
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = build_keys();
  return keys;
}

}  // namespace lattice::train
