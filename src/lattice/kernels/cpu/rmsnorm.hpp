// RMSNorm over the last dimension (Llama), forward and backward, as Hugging Face's LlamaRMSNorm.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// out[r,:] = in[r,:] * rstd_r * weight, rstd_r = 1/sqrt(mean(in[r,:]^2) + eps); saves rstd[rows].
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t C, float eps);
// rmsnorm_forward with the output rounded to bf16 (bit for bit lattice::to_bf16 of
// rmsnorm_forward's), for the bf16 GEMMs that read it: no fp32 output is written or read back.
void rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in, const float* weight,
                          int64_t rows, int64_t C, float eps);

// d_in overwritten; d_weight accumulated (+=). With `residual_grad` [rows, C], d_in = the norm's
// input gradient + residual_grad in the same pass (bit for bit as a separate add); it may not alias
// d_in. Bit-identical for any OpenMP thread count.
void rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t C,
                      const float* residual_grad = nullptr);

}  // namespace lattice::kernels
