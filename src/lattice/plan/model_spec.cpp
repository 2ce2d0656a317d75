// The planner's model: presets from the trainer's table and exact parameter counts (see
// model_spec.hpp).
#include "lattice/plan/model_spec.hpp"

#include "lattice/core/error.hpp"

namespace lattice::plan {

ModelSpec planning_model(const model::ModelConfig& config, int64_t seq_len) {
  ModelSpec spec;
  static_cast<model::ModelConfig&>(spec) = config;
  spec.seq_len = seq_len > 0 ? seq_len : config.max_seq_len;
  return spec;
}

ModelSpec model_preset(const std::string& name) {
  return planning_model(model::model_preset(name));
}

ModelSpec megatron_gpt(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                       int64_t vocab, int64_t seq_len) {
  model::ModelConfig config = model::gpt2_config(name, layers, hidden, heads, vocab, seq_len);
  config.dropout = 0.1f;
  return planning_model(config);
}

void validate(const ModelSpec& m) {
  m.validate();
  check(m.seq_len > 0, "model '" + m.name + "': the sequence length (--seq-len) must be positive");
}

ParameterCount count_parameters(const ModelSpec& m) {
  validate(m);
  const int64_t h = m.d_model;
  const int64_t kv_width = m.n_kv_heads * m.head_dim(), a = m.attention_width();
  const int64_t norm = m.norm_has_bias() ? 2 * h : h;
  ParameterCount count;
  count.embedding = m.vocab_size * h + (m.learned_positions() ? m.max_seq_len * h : 0);
  int64_t attention = h * a + 2 * h * kv_width + a * h;  // Q, K, V, output projection
  if (m.linear_bias())
    attention += a + 2 * kv_width + h;
  else if (m.qkv_bias())  // Qwen 2: biases on Q, K and V only
    attention += a + 2 * kv_width;
  if (m.qk_norm()) attention += 2 * m.head_dim();  // Qwen 3's per-head q and k norms
  // Multi-head latent attention: its five projections and two latent norms.
  if (m.latent_attention()) attention = m.attention_parameter_count();
  auto mlp_of = [&](int64_t width) {  // one MLP of `width` hidden channels
    int64_t mlp = (m.gated_mlp() ? 3 : 2) * h * width;
    if (m.linear_bias()) mlp += (m.gated_mlp() ? 2 : 1) * width + h;
    return width > 0 ? mlp : 0;
  };
  const int64_t L = m.n_layers, moe_layers = m.moe_layers(), dense_layers = L - moe_layers;
  // A routed expert: SwiGLU (3 matrices) or GELU (2: model.moe_activation); shared ones SwiGLU.
  const int64_t expert = m.moe_activation == model::MoeActivation::gelu && m.gated_mlp()
                             ? 2 * h * m.expert_ffn_hidden()
                             : mlp_of(m.expert_ffn_hidden());
  // Everything but the routed experts: attention, norms, the dense layers' MLPs and the MoE
  // layers' routers (and choice biases) and shared experts; the routed experts (a dense model: its
  // MLPs). Per layer: the mean over the layers (exact when every layer is alike).
  const int64_t router = (h + (m.has_choice_bias() ? 1 : 0)) * m.n_experts;
  const int64_t dense_total =
      L * (attention + 2 * norm) +
      moe_layers * (router + mlp_of(m.moe_shared_experts * m.expert_ffn_hidden())) +
      (m.is_moe() ? dense_layers * mlp_of(m.ffn_hidden) : 0);
  const int64_t experts_total =
      m.is_moe() ? moe_layers * m.n_experts * expert : L * mlp_of(m.ffn_hidden);
  count.per_layer_dense = dense_total / L;
  count.per_layer_experts = experts_total / L;
  count.final_norm = norm;
  count.output_head = m.tied_embeddings ? 0 : m.vocab_size * h;
  count.total =
      count.embedding + dense_total + experts_total + count.final_norm + count.output_head;
  count.active = count.total - moe_layers * expert * (m.n_experts - m.top_k);
  count.non_embedding = count.total - count.embedding - count.output_head;
  return count;
}

}  // namespace lattice::plan
