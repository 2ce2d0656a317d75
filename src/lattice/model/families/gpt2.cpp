// GPT-2's block (Radford et al. 2019; Hugging Face's GPT2Model names): x + attn(LN1(x)), then
// + MLP(LN2(·)) with GELU (tanh), biases everywhere, one packed c_attn projection of q | k | v and
// as many key/value heads as query heads. Note: Hugging Face stores GPT-2's Conv1D weights as
// [in, out]; Lattice stores every weight [out, in] and transposes on export.
#include "lattice/model/block_description.hpp"

namespace lattice::model {

BlockDescription gpt2_block(const ModelConfig& config, int64_t layer) {
  BlockDescription d;
  d.prefix = "transformer.h." + std::to_string(layer) + ".";
  d.d_model = config.d_model;
  d.norm_eps = config.norm_eps;
  AttentionDescription& a = d.attention;
  a.norm = "ln_1";
  a.norm_kind = NormKind::layer_norm;
  a.packed = "attn.c_attn";
  a.out = "attn.c_proj";
  a.heads = a.kv_heads = config.n_heads;
  a.head_dim = config.head_dim();
  a.input_bias = a.output_bias = true;
  d.mlp = GeluMlpDescription{
      "ln_2", "mlp.c_fc", "mlp.c_proj", NormKind::layer_norm, config.ffn_hidden, true};
  return d;
}

}  // namespace lattice::model
