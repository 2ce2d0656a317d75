// AdamW optimizer: see adamw_optimizer.hpp.
#include "lattice/optim/adamw_optimizer.hpp"

#include <cmath>
#include <vector>

namespace lattice::optim {

void adamw_update_store(kernels::Ops& ops, model::ParameterStore& params, float* m, float* v,
                        float lr, const AdamWSettings& settings, int64_t step, float clip) {
  float* values = params.mutable_values();
  lattice::bf16* copies = params.bf16_copies_for_writing();
  std::vector<kernels::AdamWTensor> tensors;
  tensors.reserve(params.parameters().size());
  for (const auto& p : params.parameters()) {
    kernels::AdamWTensor t;
    t.param = values + p.offset;
    t.grad = params.grads() + p.offset;
    t.m = m + p.offset;
    t.v = v + p.offset;
    t.param16 = copies != nullptr ? copies + p.offset : nullptr;
    t.n = p.numel;
    t.hyper = {lr, settings.beta1, settings.beta2, settings.eps,
               p.weight_decay ? settings.weight_decay : 0.0f};
    tensors.push_back(t);
  }
  ops.adamw_update(tensors, step, clip);
  if (copies != nullptr) params.bf16_copies_written();
}

AdamWOptimizer::AdamWOptimizer(kernels::Ops& ops, model::ParameterStore& params,
                               AdamWSettings settings, MemoryTracker* tracker)
    : ops_(ops), params_(params), settings_(settings) {
  // The moments live where the backend computes.
  m_ = Tensor({params.size()}, DType::f32, ops.memory(), tracker, MemoryCategory::optimizer_state);
  v_ = Tensor({params.size()}, DType::f32, ops.memory(), tracker, MemoryCategory::optimizer_state);
}

double AdamWOptimizer::gradient_norm() const {
  // Each parameter's sum of squares, added in parameter order (one parallel loop for all).
  std::vector<kernels::FloatRun> runs;
  runs.reserve(params_.parameters().size());
  for (const auto& p : params_.parameters()) runs.push_back({params_.grads() + p.offset, p.numel});
  return std::sqrt(ops_.sum_of_squares(runs));
}

double AdamWOptimizer::step(float lr) {
  const double norm = gradient_norm();
  float clip = 1.0f;
  if (settings_.max_grad_norm > 0) {
    // As torch.nn.utils.clip_grad_norm_: the coefficient is computed in fp32 and capped at 1.
    const float coefficient = settings_.max_grad_norm / (static_cast<float>(norm) + 1e-6f);
    clip = coefficient < 1.0f ? coefficient : 1.0f;
  }
  ++step_;
  adamw_update_store(ops_, params_, m_.f32(), v_.f32(), lr, settings_, step_, clip);
  return norm;
}

}  // namespace lattice::optim
