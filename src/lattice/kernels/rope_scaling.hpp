// RoPE scaling (context extension) as Hugging Face transformers defines it
// (modeling_rope_utils.py): the rope types default, linear, dynamic (NTK), llama3 and yarn, their
// parameters, and the inverse frequencies and cos/sin scale each gives. RopeTable builds its table
// from these; the model config carries one RopeScaling.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lattice::kernels {

// transformers' rope_type names: "default", "linear", "dynamic", "llama3", "yarn".
enum class RopeType { plain, linear, dynamic, llama3, yarn };

std::string rope_type_name(RopeType type);
// Throws lattice::Error naming the known types for an unknown name.
RopeType parse_rope_type(const std::string& name);

struct RopeScaling {
  RopeType type = RopeType::plain;
  // linear: positions divided by factor; dynamic: NTK base growth; llama3 and yarn: the context
  // extension ratio. > 0 (transformers expects >= 1).
  double factor = 1.0;
  // The pre-training context (llama3, yarn; dynamic: the length beyond which the base grows,
  // transformers' max_position_embeddings). 0: unset.
  int64_t original_max_positions = 0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  // yarn: the cos/sin scale; unset: from factor, mscale and mscale_all_dim (0.1 ln(factor) + 1).
  std::optional<double> attention_factor;
  double mscale = 0.0;          // yarn (DeepSeek): 0 unset
  double mscale_all_dim = 0.0;  // yarn (DeepSeek): 0 unset
  bool truncate = true;         // yarn: round the correction range to whole dimensions

  bool scaled() const { return type != RopeType::plain; }
  // Throws lattice::Error naming the first parameter out of range for its type and the fix.
  void validate() const;
  bool operator==(const RopeScaling&) const = default;
};

// The inverse frequencies (head_dim / 2 of them) and the cos/sin scale of RoPE with base `theta`
// and `scaling`, computed in fp32 step by step as transformers computes them. `seq_len` is the
// sequence length dynamic scaling is computed for (transformers: the forward's max position + 1);
// the other types ignore it.
struct RopeFrequencies {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
RopeFrequencies rope_frequencies(int64_t head_dim, float theta, const RopeScaling& scaling,
                                 int64_t seq_len);

// yarn's resolved attention factor (transformers' attention_factor or the mscale formula).
double yarn_attention_factor(const RopeScaling& scaling, double factor);

// The factor on the attention's softmax scale that DeepSeek's multi-head latent attention takes
// from yarn (transformers' yarn_apply_mscale): mscale(factor, mscale_all_dim)² when the scaling
// is yarn with mscale_all_dim set, else 1.
double yarn_softmax_scale_factor(const RopeScaling& scaling);

}  // namespace lattice::kernels
