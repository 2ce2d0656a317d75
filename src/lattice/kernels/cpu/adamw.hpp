// AdamW update on fp32 master weights and moments, with PyTorch's torch.optim.AdamW arithmetic.
#pragma once

#include <cstdint>

namespace lattice::kernels {

struct AdamWHyper {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// step is 1-based. grad_scale multiplies the gradient first (global-norm clipping). As PyTorch:
//   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int64_t step, float grad_scale = 1.0f);

}  // namespace lattice::kernels
