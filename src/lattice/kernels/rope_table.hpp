// The rotary position embedding's table (Hugging Face's rotate_half convention): cos and sin of
// position · inv_freq_i for every position and pair, times the scaling's attention factor (yarn),
// computed once in fp32 on the host as Hugging Face computes them. Backends apply it (Ops::rope);
// a device backend copies it once.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/kernels/rope_scaling.hpp"

namespace lattice::kernels {

class RopeTable {
 public:
  // inv_freq_i = 1 / theta^(2i/head_dim), i < head_dim/2, computed in fp32 as Hugging Face does,
  // then scaled as `scaling` says (rope_scaling.hpp). Dynamic scaling is computed for a sequence of
  // max_positions tokens (transformers recomputes it for each forward's length).
  RopeTable(int64_t max_positions, int64_t head_dim, float theta, const RopeScaling& scaling = {});

  int64_t max_positions() const { return max_positions_; }
  int64_t head_dim() const { return head_dim_; }
  // [max_positions, head_dim/2] row-major: the cos and sin of position t's pair i at t·D/2 + i.
  const float* cos() const { return cos_.data(); }
  const float* sin() const { return sin_.data(); }
  // The head_dim/2 inverse frequencies and the factor cos and sin are multiplied by (1 but yarn).
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_scaling() const { return attention_scaling_; }

 private:
  int64_t max_positions_, head_dim_;
  std::vector<float> inv_freq_;
  float attention_scaling_ = 1.0f;
  std::vector<float> cos_, sin_;
};

}  // namespace lattice::kernels
