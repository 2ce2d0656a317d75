// Mixture-of-experts row moves: see moe_rows.hpp.
#include "lattice/kernels/cpu/moe_rows.hpp"

#include <algorithm>

namespace lattice::kernels {

void moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots, int64_t C) {
#pragma omp parallel for schedule(static) if (slots * C >= (1 << 15))
  for (int64_t s = 0; s < slots; ++s) std::copy_n(x + slot_token[s] * C, C, out + s * C);
}

void moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of, int64_t tokens,
                         int64_t top_k, int64_t C) {
#pragma omp parallel for schedule(static) if (tokens * C >= (1 << 15))
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = d_x + t * C;
    std::fill(row, row + C, 0.0f);
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t slot = slot_of[t * top_k + k];
      if (slot < 0) continue;
      const float* in = d_out + slot * C;
      for (int64_t c = 0; c < C; ++c) row[c] += in[c];
    }
  }
}

void moe_combine(float* y, const float* expert_out, const float* weights, const int32_t* slot_of,
                 int64_t tokens, int64_t top_k, int64_t C) {
#pragma omp parallel for schedule(static) if (tokens * C >= (1 << 15))
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = y + t * C;
    std::fill(row, row + C, 0.0f);
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t slot = slot_of[t * top_k + k];
      if (slot < 0) continue;
      const float w = weights[t * top_k + k];
      const float* in = expert_out + slot * C;
      for (int64_t c = 0; c < C; ++c) row[c] += w * in[c];
    }
  }
}

void moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                          const float* expert_out, const float* weights, const int32_t* slot_of,
                          int64_t tokens, int64_t top_k, int64_t C) {
#pragma omp parallel for schedule(static) if (tokens * C >= (1 << 15))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = dy + t * C;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t copy = t * top_k + k;
      const int32_t slot = slot_of[copy];
      if (slot < 0) {
        d_weights[copy] = 0.0f;
        continue;
      }
      const float w = weights[copy];
      const float* out = expert_out + slot * C;
      float* d_out = d_expert_out + slot * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        d_out[c] = w * g[c];
        dot += static_cast<double>(g[c]) * out[c];
      }
      d_weights[copy] = static_cast<float>(dot);
    }
  }
}

}  // namespace lattice::kernels
