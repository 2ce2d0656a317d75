// Model presets and exact parameter counts (see model_spec.hpp).
#include "lattice/plan/model_spec.hpp"

#include "lattice/core/error.hpp"

namespace lattice::plan {

ModelSpec megatron_gpt(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                       int64_t vocab, int64_t seq_len) {
  ModelSpec model;
  model.name = name;
  model.layers = layers;
  model.hidden = hidden;
  model.heads = heads;
  model.kv_heads = heads;
  model.ffn_hidden = 4 * hidden;
  model.vocab = vocab;
  model.seq_len = seq_len;
  return model;
}

namespace {

ModelSpec llama(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                int64_t kv_heads, int64_t ffn, int64_t vocab, int64_t seq_len) {
  ModelSpec model;
  model.name = name;
  model.layers = layers;
  model.hidden = hidden;
  model.heads = heads;
  model.kv_heads = kv_heads;
  model.ffn_hidden = ffn;
  model.vocab = vocab;
  model.seq_len = seq_len;
  model.tied_embeddings = false;
  model.gated_mlp = true;
  model.learned_position_embeddings = false;
  model.layernorm_with_bias = false;
  model.linear_bias = false;
  model.dropout = false;
  return model;
}

std::vector<ModelSpec> build_presets() {
  std::vector<ModelSpec> presets;
  // GPT-2 (Radford et al. 2019; Hugging Face configs): V = 50257, s = 1024, tied embeddings.
  presets.push_back(megatron_gpt("gpt2-124m", 12, 768, 12, 50257, 1024));
  presets.push_back(megatron_gpt("gpt2-350m", 24, 1024, 16, 50257, 1024));
  presets.push_back(megatron_gpt("gpt2-774m", 36, 1280, 20, 50257, 1024));
  presets.push_back(megatron_gpt("gpt2-1.5b", 48, 1600, 25, 50257, 1024));
  // GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d = 12288, 96 heads, s = 2048.
  presets.push_back(megatron_gpt("gpt3-175b", 96, 12288, 96, 50257, 2048));
  // Llama 2 (Touvron et al. 2023): V = 32000, s = 4096; 70B uses 8 KV heads.
  presets.push_back(llama("llama-7b", 32, 4096, 32, 32, 11008, 32000, 4096));
  presets.push_back(llama("llama-13b", 40, 5120, 40, 40, 13824, 32000, 4096));
  presets.push_back(llama("llama-70b", 80, 8192, 64, 8, 28672, 32000, 4096));
  // Llama 3 / 3.1 (Dubey et al. 2024): V = 128256, 8 KV heads, s = 8192.
  presets.push_back(llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192));
  presets.push_back(llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192));
  presets.push_back(llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192));
  // Mixtral 8x7B (Jiang et al. 2024): Mistral-7B blocks with 8 experts, top-2 routing.
  ModelSpec mixtral = llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096);
  mixtral.experts = 8;
  mixtral.top_k = 2;
  presets.push_back(mixtral);
  // Megatron-LM weak scaling (Narayanan et al., SC21, Table 1): V = 51200, s = 2048.
  presets.push_back(megatron_gpt("megatron-1.7b", 24, 2304, 24));
  presets.push_back(megatron_gpt("megatron-3.6b", 30, 3072, 32));
  presets.push_back(megatron_gpt("megatron-7.5b", 36, 4096, 32));
  presets.push_back(megatron_gpt("megatron-18.4b", 40, 6144, 48));
  presets.push_back(megatron_gpt("megatron-39.1b", 48, 8192, 64));
  presets.push_back(megatron_gpt("megatron-76.1b", 60, 10240, 80));
  presets.push_back(megatron_gpt("megatron-145.6b", 80, 12288, 96));
  presets.push_back(megatron_gpt("megatron-310.1b", 96, 16384, 128));
  presets.push_back(megatron_gpt("megatron-529.6b", 105, 20480, 128));
  presets.push_back(megatron_gpt("megatron-1t", 128, 25600, 160));
  // Korthikanti et al. (MLSys 2023), Table 3: V = 51200, s = 2048.
  presets.push_back(megatron_gpt("korthikanti-22b", 48, 6144, 64));
  presets.push_back(megatron_gpt("korthikanti-175b", 96, 12288, 96));
  presets.push_back(megatron_gpt("korthikanti-530b", 105, 20480, 128));
  presets.push_back(megatron_gpt("korthikanti-1t", 128, 25600, 160));
  return presets;
}

}  // namespace

const std::vector<ModelSpec>& model_presets() {
  static const std::vector<ModelSpec> presets = build_presets();
  return presets;
}

ModelSpec model_preset(const std::string& name) {
  for (const auto& model : model_presets())
    if (model.name == name) return model;
  std::string known;
  for (const auto& model : model_presets()) known += (known.empty() ? "" : ", ") + model.name;
  throw Error("unknown model preset '" + name + "': use one of " + known +
              " (or give --layers --hidden --heads ...)");
}

void validate(const ModelSpec& m) {
  const std::string who = "model '" + m.name + "': ";
  check(
      m.layers > 0 && m.hidden > 0 && m.heads > 0 && m.kv_heads > 0 && m.ffn_hidden > 0 &&
          m.vocab > 0 && m.seq_len > 0,
      who + "layers, hidden, heads, kv_heads, ffn_hidden, vocab and seq_len must all be positive");
  check(m.hidden % m.heads == 0, who + "hidden (" + std::to_string(m.hidden) +
                                     ") must be divisible by heads (" + std::to_string(m.heads) +
                                     ")");
  check(m.heads % m.kv_heads == 0, who + "heads (" + std::to_string(m.heads) +
                                       ") must be divisible by kv_heads (" +
                                       std::to_string(m.kv_heads) + ")");
  check(m.experts >= 1 && m.top_k >= 1 && m.top_k <= m.experts,
        who + "need 1 <= top_k <= experts (got top_k " + std::to_string(m.top_k) + ", experts " +
            std::to_string(m.experts) + ")");
}

ParameterCount count_parameters(const ModelSpec& m) {
  validate(m);
  const int64_t h = m.hidden;
  const int64_t kv_width = m.kv_heads * m.head_dim();
  const int64_t norm = m.layernorm_with_bias ? 2 * h : h;
  ParameterCount count;
  count.embedding = m.vocab * h + (m.learned_position_embeddings ? m.seq_len * h : 0);
  int64_t attention = h * h + 2 * h * kv_width + h * h;  // Q, K, V, output projection
  if (m.linear_bias) attention += h + 2 * kv_width + h;
  int64_t mlp = (m.gated_mlp ? 3 : 2) * h * m.ffn_hidden;
  if (m.linear_bias) mlp += (m.gated_mlp ? 2 : 1) * m.ffn_hidden + h;
  const int64_t router = m.is_moe() ? h * m.experts : 0;
  count.per_layer_dense = attention + 2 * norm + router;
  count.per_layer_experts = mlp * m.experts;
  count.final_norm = norm;
  count.output_head = m.tied_embeddings ? 0 : m.vocab * h;
  const int64_t layer_total = count.per_layer_dense + count.per_layer_experts;
  count.total = count.embedding + m.layers * layer_total + count.final_norm + count.output_head;
  count.active = count.total - m.layers * mlp * (m.experts - m.top_k);
  count.non_embedding = count.total - count.embedding - count.output_head;
  return count;
}

}  // namespace lattice::plan
