// The GELU's bf16 vector loops of each instruction-set tier, private to kernels/cpu:
// activations_avx512.cpp's, compiled for AVX-512 and again for AVX512-BF16
// (activations_avx512bf16.cpp), where the portable tier has none (activations.cpp's loops then
// take every element). Each computes the same bits as activations.cpp's element loops and returns
// how many leading elements it did.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi), PyTorch's kBeta
inline constexpr float kGeluCubic = 0.044715f;              // PyTorch's kKappa

struct ActivationVectors {
  // gelu_forward_bf16_with_slope_on_this_thread's leading n / 16 * 16 elements (or none).
  int64_t (*gelu_forward_bf16_with_slope)(lattice::bf16* out, lattice::bf16* slope, const float* in,
                                          int64_t n);
  // One row of gelu_backward_from_slope_bf16_rows: its leading cols / 16 * 16 columns (or none).
  int64_t (*gelu_backward_from_slope_bf16_row)(lattice::bf16* d_in16, double* column_sums,
                                               const float* d_out, const lattice::bf16* slope,
                                               int64_t cols);
};

// Each AVX-512 tier's loops; callable only where cpu_features() has the tier.
namespace avx512 {
const ActivationVectors& activation_vectors();
}
namespace avx512bf16 {
const ActivationVectors& activation_vectors();
}

}  // namespace lattice::kernels
