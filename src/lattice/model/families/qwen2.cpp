// Qwen 2 and 2.5's block (Qwen team 2024; Hugging Face's Qwen2Model names): Llama's block —
// RMSNorm, grouped-query attention with RoPE, a SwiGLU MLP — with biases on the q, k and v
// projections (the output projection and the MLP have none). Its config differs from Llama's in
// defaults only (qwen2_config: RoPE base 10^6, RMSNorm eps 10^-6, the small models' tied head).
#include "lattice/model/block_description.hpp"

namespace lattice::model {

BlockDescription qwen2_block(const ModelConfig& config, int64_t layer) {
  BlockDescription d = llama_block(config, layer);
  d.attention.input_bias = true;
  return d;
}

}  // namespace lattice::model
