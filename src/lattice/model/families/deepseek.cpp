// DeepSeek-V3's block (DeepSeek-AI 2024; Hugging Face's DeepseekV3Model names): Llama's block —
// RMSNorm pre-norms, a SwiGLU MLP ("mlp.*") in the first moe_first_dense_layers layers, routed
// experts after them ("mlp.gate", "mlp.experts.<j>.*", "mlp.shared_experts.*" and, with the
// auxiliary-loss-free bias, "mlp.gate.e_score_correction_bias") — with multi-head latent attention
// ("self_attn.q_a_proj", "q_a_layernorm", "q_b_proj" or "q_proj", "kv_a_proj_with_mqa",
// "kv_a_layernorm", "kv_b_proj", "o_proj") when kv_lora_rank > 0: as many key/value heads as
// query heads, heads of qk_nope + qk_rope channels, values of v_head_dim, RoPE on the rope
// channels only (the Transformer's table is qk_rope_head_dim wide) and, under yarn with
// mscale_all_dim, the softmax scale times mscale² (transformers' yarn_apply_mscale).
#include "lattice/kernels/rope_scaling.hpp"
#include "lattice/model/block_description.hpp"

namespace lattice::model {

BlockDescription deepseek_block(const ModelConfig& config, int64_t layer) {
  BlockDescription d = llama_block(config, layer);
  if (!config.latent_attention()) return d;
  AttentionDescription& a = d.attention;
  a.k.clear();
  a.v.clear();
  a.heads = a.kv_heads = config.n_heads;
  a.head_dim = config.head_dim();
  a.v_head_dim = config.v_head_dim;
  a.rope = true;
  a.latent.q_lora_rank = config.q_lora_rank;
  a.latent.kv_lora_rank = config.kv_lora_rank;
  a.latent.qk_nope_head_dim = config.qk_nope_head_dim;
  a.latent.qk_rope_head_dim = config.qk_rope_head_dim;
  a.latent.softmax_scale_factor =
      static_cast<float>(kernels::yarn_softmax_scale_factor(config.rope_scaling));
  return d;
}

}  // namespace lattice::model
