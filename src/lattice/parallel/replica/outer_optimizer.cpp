// OuterOptimizer: see outer_optimizer.hpp.
#include "lattice/parallel/replica/outer_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::replica {

void validate(const OuterSettings& settings) {
  check(std::isfinite(settings.lr) && settings.lr > 0,
        "diloco.outer_lr must be a positive number (the paper's is 0.7; 1 with outer_momentum = 0 "
        "is plain averaging), not " +
            std::to_string(settings.lr));
  check(std::isfinite(settings.momentum) && settings.momentum >= 0 && settings.momentum < 1,
        "diloco.outer_momentum must be in [0, 1) (the paper's is 0.9), not " +
            std::to_string(settings.momentum));
}

OuterOptimizer::OuterOptimizer(const float* parameters, int64_t elements, OuterSettings settings)
    : settings_(settings),
      anchor_(parameters, parameters + elements),
      momentum_(static_cast<size_t>(elements), 0.0f) {
  validate(settings);
}

void OuterOptimizer::step(float* parameters) {
  const float lr = settings_.lr, mu = settings_.momentum;
  const bool nesterov = settings_.nesterov;
  const int64_t n = elements();
  float* anchor = anchor_.data();
  float* momentum = momentum_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float mean = parameters[i];
    const float delta = anchor[i] - mean;
    const float m = mu * momentum[i] + delta;
    momentum[i] = m;
    const float direction = nesterov ? delta + mu * m : m;
    const float updated = mean + (delta - lr * direction);
    parameters[i] = updated;
    anchor[i] = updated;
  }
  ++steps_;
}

void OuterOptimizer::load(const float* anchor, const float* momentum, int64_t steps_taken) {
  std::copy_n(anchor, anchor_.size(), anchor_.begin());
  std::copy_n(momentum, momentum_.size(), momentum_.begin());
  steps_ = steps_taken;
}

}  // namespace lattice::replica
