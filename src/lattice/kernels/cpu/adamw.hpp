// AdamW update on fp32 master weights and moments, with PyTorch's torch.optim.AdamW arithmetic.
#pragma once

#include <cstdint>
#include <span>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/optimizer_operands.hpp"

namespace lattice::kernels {

// step is 1-based. grad_scale multiplies the gradient first (global-norm clipping). As PyTorch:
//   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// Follows torch 1.13's single-tensor (non-foreach, non-fused) AdamW operation by operation as its
// vectorised CPU kernels compute it (transcribed from ATen; see adamw.cpp), so results should match
// torch bit for bit. grad is read only (the scaled gradient is not written back). When param16 is
// not null it receives the updated param rounded to bf16 (lattice::to_bf16), in the same pass: the
// parameter store's bf16 copy, written while the values are in cache.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int64_t step, float grad_scale = 1.0f,
                  lattice::bf16* param16 = nullptr);

// adamw_update on every tensor (bit for bit the same), their chunks in one parallel loop, as
// PyTorch's foreach / multi-tensor optimizers: a model's many small parameters cost one OpenMP
// region, not one each.
void adamw_update_tensors(std::span<const AdamWTensor> tensors, int64_t step,
                          float grad_scale = 1.0f);

}  // namespace lattice::kernels
