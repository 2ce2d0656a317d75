// RopeTable: the fp32 cos/sin table, computed as Hugging Face's LlamaRotaryEmbedding does.
#include "lattice/kernels/rope_table.hpp"

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

}  // namespace lattice::kernels
