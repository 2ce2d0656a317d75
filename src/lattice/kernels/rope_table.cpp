// RopeTable: the fp32 cos/sin table, computed as Hugging Face's LlamaRotaryEmbedding does.
#include "lattice/kernels/rope_table.hpp"

#include <cmath>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

RopeTable::RopeTable(int64_t max_positions, int64_t head_dim, float theta,
                     const RopeScaling& scaling)
    : max_positions_(max_positions), head_dim_(head_dim) {
  check(max_positions > 0,
        "RopeTable: max_positions must be positive, got " + std::to_string(max_positions));
  check(head_dim > 0 && head_dim % 2 == 0,
        "RopeTable: head_dim must be positive and even, got " + std::to_string(head_dim));
  check(theta > 0, "RopeTable: theta must be positive (Llama uses 10000 or 500000)");
  // Hugging Face: inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D)), all in fp32, then the
  // scaling's adjustments; the angle is the fp32 product position * inv_freq; cos and sin are taken
  // of that fp32 angle and multiplied by the attention scaling (yarn's; skipped when it is 1).
  RopeFrequencies frequencies = rope_frequencies(head_dim, theta, scaling, max_positions);
  inv_freq_ = std::move(frequencies.inv_freq);
  attention_scaling_ = frequencies.attention_scaling;
  const int64_t half = head_dim / 2;
  cos_.resize(static_cast<size_t>(max_positions * half));
  sin_.resize(static_cast<size_t>(max_positions * half));
  const bool scaled = attention_scaling_ != 1.0f;
  for (int64_t t = 0; t < max_positions; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq_[static_cast<size_t>(i)];
      float c = std::cos(angle), s = std::sin(angle);
      if (scaled) {
        c *= attention_scaling_;
        s *= attention_scaling_;
      }
      cos_[static_cast<size_t>(t * half + i)] = c;
      sin_[static_cast<size_t>(t * half + i)] = s;
    }
  }
}

}  // namespace lattice::kernels
