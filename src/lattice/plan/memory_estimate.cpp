// Memory estimates per pipeline rank (see memory_estimate.hpp).
#include "lattice/plan/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/stage_partition.hpp"

namespace lattice::plan {

double model_state_bytes(double params, int zero_stage, int shard_ranks, int param_bytes,
                         int grad_bytes, int optimizer_bytes) {
  const double n = std::max(shard_ranks, 1);
  const double p = param_bytes, g = grad_bytes, k = optimizer_bytes;
  switch (zero_stage) {
    case 0:
      return (p + g + k) * params;
    case 1:
      return (p + g) * params + k * params / n;
    case 2:
      return p * params + (g + k) * params / n;
    case 3:
      return (p + g + k) * params / n;
  }
  throw Error("zero stage must be 0, 1, 2 or 3 (got " + std::to_string(zero_stage) + ")");
}

namespace {

// One layer's activation bytes when it is checkpointed with `mode`.
double layer_activation_bytes(const ModelSpec& m, const ParallelLayout& l, Recompute mode) {
  const double s = static_cast<double>(m.seq_len) / l.cp;  // tokens of the sequence on this rank
  const double b = l.micro_batch_size;
  const double h = static_cast<double>(m.d_model);
  const double a = static_cast<double>(m.n_heads);
  const double t = l.tp;
  const double f = static_cast<double>(m.ffn_hidden);
  // The query and key/value channels (h and kv_share · h unless the heads have their own width).
  const double q_width = static_cast<double>(m.attention_width());
  const double kv_width = static_cast<double>(m.n_kv_heads * m.head_dim());
  const double sbh = s * b * h;
  if (mode == Recompute::kFull)  // only the layer input is kept (sharded over tp with SP)
    return 2 * sbh / (l.sequence_parallel ? t : 1);
  const double masks =
      m.has_dropout() ? 2 : 0;  // attention-output and MLP-output dropout masks (1 byte)
  // Kept whole on every TP rank unless sequence parallel: two norm inputs, QKV input, MLP input,
  // masks.
  const double replicated = sbh * (4 + 2 + 2 + masks);
  // Sharded over TP: Q, K, V, the projection input, and the MLP's activation inputs/outputs.
  // A MoE layer: its top_k routed experts' (of their own width) and its shared experts' MLP
  // tensors, and the dispatched copies; a layer's mean where dense layers come first (DeepSeek)
  // or alternate.
  const double per_width = m.gated_mlp() ? 6 : 4;
  double mlp_per_token = per_width * f;
  if (m.is_moe()) {
    const double expert = static_cast<double>(m.expert_ffn_hidden());
    const double moe_layer =
        per_width * expert * m.top_k + 6 * expert * m.moe_shared_experts + 2 * h * m.top_k;
    const double L = static_cast<double>(m.n_layers), moe_layers = m.moe_layers();
    mlp_per_token = (moe_layers * moe_layer + (L - moe_layers) * per_width * f) / L;
  }
  // Q, K and V (2 bytes each), and the output projection's input (the attention's output: as
  // wide as the value heads). Multi-head latent attention: H heads of qk channels for Q and K, of
  // v_head_dim for V and the output; its latent tensors (q_a's output and the query norm's, the
  // compressed c and its norm's) are kept whole on every tp rank, computed on all rows.
  const double attention_per_token =
      m.latent_attention() ? 2 * (2 * q_width + 2 * a * static_cast<double>(m.v_head_dim))
                           : 2 * q_width + 4 * kv_width + 2 * q_width;
  const double latent_kept =
      m.latent_attention() ? s * b * 2 * (2 * static_cast<double>(m.q_lora_rank + m.kv_lora_rank))
                           : 0;
  const double sharded = s * b * attention_per_token + s * b * mlp_per_token;
  // Attention scores: softmax output (2 bytes), with dropout also its mask (1) and output (2); none
  // with FlashAttention. FlashAttention keeps only the fp32 log-sum-exp per query and head. Under
  // a sliding window each query scores at most `window` keys.
  const double keys =
      m.sliding_window > 0 ? std::min(s, static_cast<double>(m.sliding_window)) : s;
  const double scores = l.flash_attention               ? b * a * s * 4
                        : mode == Recompute::kSelective ? 0
                                                        : b * a * s * keys * (m.has_dropout() ? 5 : 2);
  return replicated / (l.sequence_parallel ? t : 1) + latent_kept + (sharded + scores) / t;
}

// The virtual stages (chunks of n_layers / (pp v) consecutive layers) pipeline rank `stage` owns:
// interleaved rank r owns r, r + p, r + 2p, ...; ZB-V's V owns r and 2p - 1 - r.
std::vector<int> virtual_stages_of(const ParallelLayout& l, int stage) {
  if (l.pp > 1 && l.schedule == pipeline::ScheduleKind::kZeroBubbleV)
    return {stage, 2 * l.pp - 1 - stage};
  std::vector<int> owned;
  for (int chunk = 0; chunk < l.virtual_stages; ++chunk) owned.push_back(chunk * l.pp + stage);
  return owned;
}

// Mean activation bytes per layer on pipeline rank `stage`: with full recomputation of every k-th
// block (k > 1) its recomputed blocks keep only their input and the others keep everything.
double stage_bytes_per_layer(const ModelSpec& m, const ParallelLayout& l, int stage) {
  if (l.recompute != Recompute::kFull || l.recompute_interval <= 1)
    return layer_activation_bytes(m, l, l.recompute);
  const model::ActivationCheckpoint checkpoint = l.activation_checkpoint();
  const pipeline::StagePartition partition =
      pipeline::even_partition(m.n_layers, l.pp * l.virtual_stages);
  int64_t layers = 0, recomputed = 0;
  for (int chunk : virtual_stages_of(l, stage)) {
    layers += partition.layers(chunk);
    recomputed += checkpoint.full_blocks_in(partition.first[static_cast<size_t>(chunk)],
                                            partition.layers(chunk));
  }
  const double full = layer_activation_bytes(m, l, Recompute::kFull);
  const double kept = layer_activation_bytes(m, l, Recompute::kNone);
  return (static_cast<double>(recomputed) * full +
          static_cast<double>(layers - recomputed) * kept) /
         static_cast<double>(layers);
}

}  // namespace

double activation_bytes_per_layer(const ModelSpec& m, const ParallelLayout& l) {
  return layer_activation_bytes(m, l, l.recompute);
}

int peak_chunks_in_flight(const ParallelLayout& l, int stage) {
  const int p = l.pp;
  const int m = l.num_microbatches();
  const int v = l.virtual_stages;
  if (p == 1) return 1;
  switch (l.schedule) {
    case pipeline::ScheduleKind::kGPipe:
      return m;
    case pipeline::ScheduleKind::kOneFOneB:
    case pipeline::ScheduleKind::kZeroBubbleH1:
      return std::min(p - stage, m);
    case pipeline::ScheduleKind::kZeroBubbleV:  // bound kept by the generator, on every rank
      return std::min(2 * p, 2 * m);
    case pipeline::ScheduleKind::kInterleaved:
      return std::min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
  }
  return m;
}

const StageMemory& MemoryEstimate::peak() const {
  return *std::max_element(
      stages.begin(), stages.end(),
      [](const StageMemory& x, const StageMemory& y) { return x.total() < y.total(); });
}

MemoryEstimate estimate_memory(const ModelSpec& m, const ParallelLayout& l) {
  validate_layout(m, l);
  const ParameterCount count = count_parameters(m);
  const double t = l.tp;
  // Each rank's layers: its virtual stages' blocks, split as the trainer splits them (the remainder
  // of a layer count the stages do not divide on the middle stages).
  const pipeline::StagePartition partition =
      pipeline::even_partition(m.n_layers, l.pp * l.virtual_stages);
  const int dense_shards = l.dp * l.cp;
  const int expert_shards = std::max(1, dense_shards / l.ep);
  const double s = static_cast<double>(m.seq_len) / l.cp;
  const double b = l.micro_batch_size;
  const double h = static_cast<double>(m.d_model);
  MemoryEstimate estimate;
  for (int stage = 0; stage < l.pp; ++stage) {
    StageMemory mem;
    mem.stage = stage;
    double layers_per_rank = 0;
    for (int chunk : virtual_stages_of(l, stage))
      layers_per_rank += static_cast<double>(partition.layers(chunk));
    const double layers_per_chunk = layers_per_rank / l.virtual_stages;
    // ZB-V folds the pipeline into a V: the first and the last virtual stage both live on rank 0.
    const bool v_shape = l.pp > 1 && l.schedule == pipeline::ScheduleKind::kZeroBubbleV;
    const bool first = stage == 0;
    const bool last = v_shape ? stage == 0 : stage == l.pp - 1;
    double dense = layers_per_rank * count.per_layer_dense / t;
    double experts = layers_per_rank * count.per_layer_experts / (t * l.ep);
    if (first) dense += count.embedding / t;
    if (last) {
      dense += count.final_norm + count.output_head / t;
      if (m.tied_embeddings && l.pp > 1)
        dense += m.vocab_size * h / t;  // the head's copy of the embedding
    }
    mem.parameters = dense + experts;
    auto states = [&](int p_bytes, int g_bytes, int k_bytes) {
      return model_state_bytes(dense, l.zero_stage, dense_shards, p_bytes, g_bytes, k_bytes) +
             model_state_bytes(experts, l.zero_stage, expert_shards, p_bytes, g_bytes, k_bytes);
    };
    mem.parameter_bytes = states(l.param_bytes, 0, 0);
    mem.gradient_bytes = states(0, l.grad_bytes, 0);
    mem.optimizer_bytes = states(0, 0, l.optimizer_bytes);
    const int chunks = peak_chunks_in_flight(l, stage);
    mem.activation_bytes = chunks * layers_per_chunk * stage_bytes_per_layer(m, l, stage);
    const int microbatches_in_flight = (chunks + l.virtual_stages - 1) / l.virtual_stages;
    if (first && m.has_dropout())  // embedding dropout mask
      mem.activation_bytes += microbatches_in_flight * s * b * h / (l.sequence_parallel ? t : 1);
    if (last)  // final norm input, bf16 logits and fp32 loss softmax of one microbatch
      mem.temporary_bytes += 2 * s * b * h + 6 * s * b * static_cast<double>(m.vocab_size) / t;
    if (l.zero_stage == 3)  // current and prefetched layer gathered in full
      mem.temporary_bytes +=
          2 * l.param_bytes * (count.per_layer_dense + count.per_layer_experts / l.ep) / t;
    estimate.stages.push_back(mem);
  }
  return estimate;
}

MinimumDevices minimum_devices(const ModelSpec& model, const HardwareSpec& hardware,
                               const ParallelLayout& precision) {
  const double params = static_cast<double>(count_parameters(model).total);
  MinimumDevices result;
  result.weight_bytes = params * precision.param_bytes;
  result.model_state_bytes =
      params * (precision.param_bytes + precision.grad_bytes + precision.optimizer_bytes);
  result.for_weights = static_cast<int>(std::ceil(result.weight_bytes / hardware.memory_bytes));
  result.for_model_state =
      static_cast<int>(std::ceil(result.model_state_bytes / hardware.memory_bytes));
  return result;
}

}  // namespace lattice::plan
