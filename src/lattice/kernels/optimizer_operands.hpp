// The operands of the optimizer's kernels as every backend takes them: AdamW's hyperparameters and
// tensors, and the runs of floats a gradient norm sums.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// Hyperparameters are doubles because PyTorch's are Python floats: the scalar factors (1 - lr*wd,
// lr / (1 - b1^step), ...) are computed in double and only then rounded to fp32, as torch does.
struct AdamWHyper {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

// One tensor of a multi-tensor update: adamw_update's arguments (kernels/cpu/adamw.hpp).
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  lattice::bf16* param16 = nullptr;
  int64_t n = 0;
  AdamWHyper hyper;
};

// A run of floats (a gradient norm's operand).
struct FloatRun {
  const float* data = nullptr;
  int64_t n = 0;
};

}  // namespace lattice::kernels
