// LayerNorm over the last dimension (GPT-2), forward and backward. Biased variance as in PyTorch.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// out[r,:] = (in[r,:] - mean_r) * rstd_r * weight + bias; saves mean[rows] and rstd[rows].
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t C, float eps);
// layernorm_forward with the output rounded to bf16 (bit for bit lattice::to_bf16 of
// layernorm_forward's), for the bf16 GEMM that reads it: no fp32 output is written or read back.
void layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                            const float* weight, const float* bias, int64_t rows, int64_t C,
                            float eps);

// d_in overwritten; d_weight and d_bias accumulated (+=). Bit-identical for any OpenMP thread
// count.
void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                        const float* in, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t C);

}  // namespace lattice::kernels
