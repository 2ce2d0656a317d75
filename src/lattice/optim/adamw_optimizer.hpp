// AdamW optimizer over a flat ParameterStore: fp32 moments per parameter, weight decay only where
// the parameter asks for it (matrices and embeddings), global-norm gradient clipping (PyTorch's
// clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1).
#pragma once

#include <cstdint>

#include "lattice/core/tensor.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::optim {

struct AdamWSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float max_grad_norm = 1.0f;  // <= 0 disables clipping
};

// AdamW on every parameter of `params`, its moments m and v laid out as its values: lr, the
// settings' betas and eps, weight decay on the parameters that ask for it, gradients scaled by
// `clip`; the store's bf16 copies, when it keeps them, rounded in the same pass. The update of
// AdamWOptimizer::step and of plain data parallelism.
void adamw_update_store(kernels::Ops& ops, model::ParameterStore& params, float* m, float* v,
                        float lr, const AdamWSettings& settings, int64_t step, float clip);

class AdamWOptimizer {
 public:
  // `ops` runs the update and the norm and must outlive the optimizer.
  AdamWOptimizer(kernels::Ops& ops, model::ParameterStore& params, AdamWSettings settings,
                 MemoryTracker* tracker);

  // L2 norm of all gradients (each parameter once), accumulated in double.
  double gradient_norm() const;
  // One update at learning rate lr; clips first when enabled. Returns the pre-clip gradient norm.
  double step(float lr);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }
  float* exp_avg() { return m_.f32(); }
  float* exp_avg_sq() { return v_.f32(); }
  const float* exp_avg() const { return m_.f32(); }
  const float* exp_avg_sq() const { return v_.f32(); }
  // The memory the moments live in (the backend's).
  DeviceMemory& memory() const { return m_.memory(); }
  const AdamWSettings& settings() const { return settings_; }

 private:
  kernels::Ops& ops_;
  model::ParameterStore& params_;
  AdamWSettings settings_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace lattice::optim
