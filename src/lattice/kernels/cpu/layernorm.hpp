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

// d_in overwritten; d_weight and d_bias accumulated (+=). With `residual_grad` [rows, C] (the
// gradient reaching the same input through a residual connection), d_in = the norm's input
// gradient + residual_grad, in the same pass (as a separate add_inplace would, bit for bit);
// residual_grad may not alias d_in. Bit-identical for any OpenMP thread count.
void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                        const float* in, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t C, const float* residual_grad = nullptr);

}  // namespace lattice::kernels
