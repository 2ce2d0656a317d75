// Rotary position embedding with the half rotation of Hugging Face (rotate_half), applied in place.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::kernels {

class RopeTable {
 public:
  // inv_freq_i = 1 / theta^(2i/head_dim), i < head_dim/2, computed in fp32 as Hugging Face does.
  RopeTable(int64_t max_positions, int64_t head_dim, float theta);

  // x holds [batch, seq, heads, head_dim] with `row_stride` elements between consecutive tokens and
  // `batch_stride` between batches; token t has position pos_offset + t. For each pair i < D/2:
  //   x'[i] = x[i] cos - x[i+D/2] sin,  x'[i+D/2] = x[i+D/2] cos + x[i] sin.
  // inverse = true rotates by the negative angle, which is the backward of the forward rotation.
  void apply(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t row_stride,
             int64_t batch_stride, int64_t pos_offset, bool inverse) const;

  int64_t max_positions() const { return max_positions_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t max_positions_, head_dim_;
  std::vector<float> cos_, sin_;  // [max_positions, head_dim/2]
};

}  // namespace lattice::kernels
