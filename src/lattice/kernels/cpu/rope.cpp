// Rotary position embedding (Hugging Face Llama's rotate_half convention): the fp32 cos/sin table
// and the in-place rotation of strided [batch, seq, heads, head_dim] tensors.
#include "lattice/kernels/cpu/rope.hpp"

#include <cmath>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

RopeTable::RopeTable(int64_t max_positions, int64_t head_dim, float theta)
    : max_positions_(max_positions), head_dim_(head_dim) {
  check(max_positions > 0,
        "RopeTable: max_positions must be positive, got " + std::to_string(max_positions));
  check(head_dim > 0 && head_dim % 2 == 0,
        "RopeTable: head_dim must be positive and even, got " + std::to_string(head_dim));
  check(theta > 0, "RopeTable: theta must be positive (Llama uses 10000 or 500000)");
  const int64_t half = head_dim / 2;
  // Hugging Face: inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D)), all in fp32; the angle
  // is the fp32 product position * inv_freq; cos and sin are taken of that fp32 angle.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(theta, exponent);
  }
  cos_.resize(static_cast<size_t>(max_positions * half));
  sin_.resize(static_cast<size_t>(max_positions * half));
  for (int64_t t = 0; t < max_positions; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(t * half + i)] = std::cos(angle);
      sin_[static_cast<size_t>(t * half + i)] = std::sin(angle);
    }
  }
}

void RopeTable::apply(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t row_stride,
                      int64_t batch_stride, int64_t pos_offset, bool inverse) const {
  check(pos_offset >= 0 && pos_offset + seq <= max_positions_,
        "rope: positions " + std::to_string(pos_offset) + ".." + std::to_string(pos_offset + seq) +
            " exceed the table's max_positions " + std::to_string(max_positions_) +
            "; build the RopeTable with a larger max_positions");
  check(row_stride >= heads * head_dim_,
        "rope: row_stride " + std::to_string(row_stride) +
            " is smaller than heads * head_dim = " + std::to_string(heads * head_dim_));
  const int64_t half = head_dim_ / 2;
  // Rotating by -angle (the inverse, and the adjoint since rotations are orthogonal) flips sin's
  // sign.
  const float sin_sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static) if (batch * seq * heads * head_dim_ > 65536)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* cos_row = cos_.data() + (pos_offset + t) * half;
      const float* sin_row = sin_.data() + (pos_offset + t) * half;
      float* row = x + b * batch_stride + t * row_stride;
      for (int64_t h = 0; h < heads; ++h) {
        float* first = row + h * head_dim_;
        float* second = first + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos_row[i], s = sin_sign * sin_row[i];
          const float x1 = first[i], x2 = second[i];
          first[i] = x1 * c - x2 * s;
          second[i] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace lattice::kernels
