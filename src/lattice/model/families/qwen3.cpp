// Qwen 3's block (Qwen team 2025; Hugging Face's Qwen3Model and Qwen3MoeModel names): Llama's
// block — RMSNorm, grouped-query attention with RoPE, a SwiGLU MLP or routed experts — with a
// per-head RMSNorm of q and of k over head_dim before RoPE ("self_attn.q_norm", "self_attn.k_norm")
// and no biases. Its heads have their own width (head_dim 128 at any hidden size); its MoE layers
// are "mlp.gate" and "mlp.experts.<j>.*" (the deepseek names) without shared experts.
#include "lattice/model/block_description.hpp"

namespace lattice::model {

BlockDescription qwen3_block(const ModelConfig& config, int64_t layer) {
  BlockDescription d = llama_block(config, layer);
  d.attention.q_norm = "self_attn.q_norm";
  d.attention.k_norm = "self_attn.k_norm";
  return d;
}

}  // namespace lattice::model
