// Llama's block (Touvron et al. 2023; Hugging Face's LlamaModel names): x + o_proj(attention(
// RoPE(q), RoPE(k), v)) over RMSNorm(x), then + down_proj(silu(gate_proj(·)) · up_proj(·)) over
// RMSNorm; grouped-query attention, no biases. A MoE layer (ModelConfig::is_moe_layer) has routed
// experts (Mixtral's or DeepSeek's names) and, with shared experts, a SwiGLU of their width beside
// them. Heads of their own width (ModelConfig::head_dim) and a sliding window come from the config.
#include "lattice/model/block_description.hpp"

namespace lattice::model {

BlockDescription llama_block(const ModelConfig& config, int64_t layer) {
  BlockDescription d;
  d.prefix = "model.layers." + std::to_string(layer) + ".";
  d.d_model = config.d_model;
  d.norm_eps = config.norm_eps;
  AttentionDescription& a = d.attention;
  a.norm = "input_layernorm";
  a.norm_kind = NormKind::rms_norm;
  a.q = "self_attn.q_proj";
  a.k = "self_attn.k_proj";
  a.v = "self_attn.v_proj";
  a.out = "self_attn.o_proj";
  a.heads = config.n_heads;
  a.kv_heads = config.n_kv_heads;
  a.head_dim = config.head_dim();
  a.rope = true;
  a.sliding_window = config.sliding_window;
  const std::string norm = "post_attention_layernorm";
  if (!config.is_moe_layer(layer)) {
    d.mlp =
        SwiGluMlpDescription{norm,
                             NormKind::rms_norm,
                             {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", config.ffn_hidden}};
    return d;
  }
  MoeLayerDescription moe;
  moe.norm = norm;
  moe.experts = config.moe_names == MoeNames::mixtral ? "block_sparse_moe." : "mlp.";
  moe.settings = moe_settings(config);
  moe.balancing = moe_balancing(config);
  moe.names = config.moe_names;
  moe.expert_hidden = config.expert_ffn_hidden();
  const std::string shared = moe.experts + "shared_experts.";
  moe.shared = {shared + "gate_proj", shared + "up_proj", shared + "down_proj",
                config.moe_shared_experts * config.expert_ffn_hidden()};
  d.mlp = moe;
  return d;
}

}  // namespace lattice::model
