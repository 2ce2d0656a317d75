// The rotary position embedding's table (Hugging Face's rotate_half convention): cos and sin of
// position · inv_freq_i for every position and pair, computed once in fp32 on the host as Hugging
// Face computes them. Backends apply it (Ops::rope); a device backend copies it once.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::kernels {

class RopeTable {
 public:
  // inv_freq_i = 1 / theta^(2i/head_dim), i < head_dim/2, computed in fp32 as Hugging Face does.
  RopeTable(int64_t max_positions, int64_t head_dim, float theta);

  int64_t max_positions() const { return max_positions_; }
  int64_t head_dim() const { return head_dim_; }
  // [max_positions, head_dim/2] row-major: the cos and sin of position t's pair i at t·D/2 + i.
  const float* cos() const { return cos_.data(); }
  const float* sin() const { return sin_.data(); }

 private:
  int64_t max_positions_, head_dim_;
  std::vector<float> cos_, sin_;
};

}  // namespace lattice::kernels
