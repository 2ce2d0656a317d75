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
  step(parameters, {{0, elements()}});
}

namespace {

// The outer step on n elements (anchor, momentum and the packed values from `at`): from θ̄ (the
// formula that makes lr 1 without momentum the identity) or from the mean Δ itself.
void outer_update(const OuterSettings& s, float* anchor, float* momentum, float* at, int64_t n,
                  bool from_delta) {
  const float lr = s.lr, mu = s.momentum;
  const bool nesterov = s.nesterov;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float delta = from_delta ? at[i] : anchor[i] - at[i];
    const float m = mu * momentum[i] + delta;
    momentum[i] = m;
    const float direction = nesterov ? delta + mu * m : m;
    const float updated =
        from_delta ? anchor[i] - lr * direction : at[i] + (delta - lr * direction);
    at[i] = updated;
    anchor[i] = updated;
  }
}

}  // namespace

void OuterOptimizer::step(float* packed, const std::vector<ElementRange>& ranges) {
  for (const ElementRange& r : ranges) {
    outer_update(settings_, anchor_.data() + r.begin, momentum_.data() + r.begin, packed,
                 r.end - r.begin, false);
    packed += r.end - r.begin;
  }
  ++steps_;
}

void OuterOptimizer::step_delta(float* packed, const std::vector<ElementRange>& ranges) {
  for (const ElementRange& r : ranges) {
    outer_update(settings_, anchor_.data() + r.begin, momentum_.data() + r.begin, packed,
                 r.end - r.begin, true);
    packed += r.end - r.begin;
  }
  ++steps_;
}

void OuterOptimizer::load(const float* anchor, const float* momentum, int64_t steps_taken) {
  std::copy_n(anchor, anchor_.size(), anchor_.begin());
  std::copy_n(momentum, momentum_.size(), momentum_.begin());
  steps_ = steps_taken;
}

}  // namespace lattice::replica
