// Command-line options shared by `lattice estimate`, `lattice simulate` and `lattice plan`: the
// model (a preset and/or explicit dimensions), the parallel layout and the hardware. Header-only
// over CLI11 so that only the CLI depends on CLI11; resolution into ModelSpec / ParallelLayout /
// HardwareSpec is here.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/plan/hardware.hpp"
#include "lattice/plan/layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan::cli {

struct ModelOptions {
  std::string preset;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, vocab = 0, seq_len = 0;
  int64_t experts = 0, top_k = 0;
  std::string mlp;  // "gelu" or "swiglu"
};

inline void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.preset,
                 "model preset (gpt2-124m ... llama3-405b, mixtral-8x7b, ...)");
  app.add_option("--layers", o.layers, "transformer layers (overrides the preset)");
  app.add_option("--hidden", o.hidden, "hidden size");
  app.add_option("--heads", o.heads, "attention heads");
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (GQA); default: heads");
  app.add_option("--ffn-hidden", o.ffn_hidden, "MLP inner width; default 4 x hidden");
  app.add_option("--vocab", o.vocab, "vocabulary size");
  app.add_option("--seq-len", o.seq_len, "sequence length (and the model's position table)");
  app.add_option("--experts", o.experts, "MoE experts per layer");
  app.add_option("--top-k", o.top_k, "experts per token");
  app.add_option("--mlp", o.mlp, "gelu (GPT) or swiglu (Llama) when giving explicit dimensions");
}

inline ModelSpec resolve_model(const ModelOptions& o) {
  ModelSpec m;
  if (!o.preset.empty()) {
    m = model_preset(o.preset);
  } else {
    check(o.layers > 0 && o.hidden > 0 && o.heads > 0,
          "give --model <preset> or at least --layers, --hidden and --heads");
    m = megatron_gpt("custom", o.layers, o.hidden, o.heads, 51200, 2048);
  }
  if (o.layers) m.n_layers = o.layers;
  if (o.hidden) m.d_model = o.hidden;
  if (o.heads) m.n_heads = o.heads;
  if (o.kv_heads) m.n_kv_heads = o.kv_heads;
  if (o.heads && !o.kv_heads) m.n_kv_heads = o.heads;
  if (o.ffn_hidden)
    m.ffn_hidden = o.ffn_hidden;
  else if (o.preset.empty())
    m.ffn_hidden = 4 * m.d_model;
  if (o.vocab) m.vocab_size = o.vocab;
  if (o.seq_len) m.seq_len = m.max_seq_len = o.seq_len;  // trained at, and positions for
  if (o.experts) m.n_experts = o.experts;
  if (o.top_k) m.top_k = o.top_k;
  if (o.mlp == "swiglu") {  // the Llama family: RoPE, RMSNorm, no biases, untied, no dropout
    m.family = model::Family::llama;
    m.dropout = 0;
    m.tied_embeddings = false;
  } else if (!o.mlp.empty()) {
    check(o.mlp == "gelu", "unknown --mlp '" + o.mlp + "': use gelu or swiglu");
  }
  validate(m);
  return m;
}

struct LayoutOptions {
  int gpus = 0, dp = 0, tp = 1, pp = 1, cp = 1, ep = 1, zero = 0, virtual_stages = 1;
  int recompute_interval = 1;
  int micro_batch = 1, global_batch = 0;
  bool sequence_parallel = false, overlap_grad_reduce = false, flash_attention = false;
  std::string recompute = "none", schedule = "1f1b";
};

inline void add_layout_options(CLI::App& app, LayoutOptions& o) {
  app.add_option("--gpus", o.gpus,
                 "devices in total (dp = gpus / (tp pp cp) when --dp is not given)");
  app.add_option("--dp", o.dp, "data-parallel replicas");
  app.add_option("--tp", o.tp, "tensor-parallel size");
  app.add_option("--pp", o.pp, "pipeline stages");
  app.add_option("--cp", o.cp, "context-parallel size");
  app.add_option("--ep", o.ep, "expert-parallel size");
  app.add_option("--zero", o.zero, "ZeRO stage 0-3");
  app.add_flag("--sp", o.sequence_parallel, "sequence parallelism (with tp > 1)");
  app.add_option("--recompute", o.recompute,
                 "none, selective or full (as the trainer's activation_checkpoint.mode)");
  app.add_option("--recompute-interval", o.recompute_interval,
                 "with full: recompute every k-th block (activation_checkpoint.interval)");
  app.add_option("--schedule", o.schedule, "gpipe, 1f1b, interleaved, zb-h1 or zb-v");
  app.add_option("--virtual-stages", o.virtual_stages, "chunks per pipeline rank (interleaved)");
  app.add_option("--micro-batch", o.micro_batch, "sequences per microbatch");
  app.add_option("--global-batch", o.global_batch,
                 "sequences per optimizer step (default: mb x dp)");
  app.add_flag("--overlap-grad-reduce", o.overlap_grad_reduce,
               "overlap the data-parallel gradient reduction with backward");
  app.add_flag("--flash-attention", o.flash_attention,
               "fused causal attention: no score traffic or storage, masked half skipped");
}

inline ParallelLayout resolve_layout(const LayoutOptions& o) {
  ParallelLayout l;
  l.tp = o.tp;
  l.pp = o.pp;
  l.cp = o.cp;
  l.ep = o.ep;
  check(l.tp >= 1 && l.pp >= 1 && l.cp >= 1, "--tp, --pp and --cp must be at least 1");
  if (o.dp > 0) {
    l.dp = o.dp;
    check(o.gpus == 0 || o.gpus == l.dp * l.tp * l.pp * l.cp,
          "--gpus " + std::to_string(o.gpus) + " disagrees with dp x tp x pp x cp = " +
              std::to_string(l.dp * l.tp * l.pp * l.cp) + ": drop one of them");
  } else if (o.gpus > 0) {
    check(o.gpus % (l.tp * l.pp * l.cp) == 0,
          "--gpus " + std::to_string(o.gpus) +
              " is not divisible by tp x pp x cp = " + std::to_string(l.tp * l.pp * l.cp));
    l.dp = o.gpus / (l.tp * l.pp * l.cp);
  }
  l.zero_stage = o.zero;
  l.sequence_parallel = o.sequence_parallel;
  l.overlap_grad_reduce = o.overlap_grad_reduce;
  l.flash_attention = o.flash_attention;
  l.recompute = parse_recompute(o.recompute);
  l.recompute_interval = o.recompute_interval;
  l.schedule = pipeline::parse_schedule_kind(o.schedule);
  l.virtual_stages = o.virtual_stages;
  const bool chunked = l.schedule == pipeline::ScheduleKind::kInterleaved ||
                       l.schedule == pipeline::ScheduleKind::kZeroBubbleV;
  if (chunked && o.virtual_stages == 1) l.virtual_stages = 2;
  l.micro_batch_size = o.micro_batch;
  l.global_batch_size = o.global_batch > 0 ? o.global_batch : o.micro_batch * l.dp;
  return l;
}

struct HardwareOptions {
  std::string gpu = "a100-80gb";
  std::string hardware_file;
};

inline void add_hardware_options(CLI::App& app, HardwareOptions& o) {
  app.add_option("--gpu", o.gpu, "device type from the catalog (a100-80gb, h100-sxm, ..., cpu)");
  app.add_option("--hardware-file", o.hardware_file,
                 "TOML file adding or overriding catalog entries ([gpu.<name>] tables)");
}

inline HardwareSpec resolve_hardware(const HardwareOptions& o) {
  HardwareCatalog catalog;
  if (!o.hardware_file.empty()) catalog.load_toml_file(o.hardware_file);
  return catalog.get(o.gpu);
}

}  // namespace lattice::plan::cli
