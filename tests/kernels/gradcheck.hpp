// Test helpers for kernels: random tensors, central finite differences and a relative-error
// compare.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/rng.hpp"

namespace lattice::testing {

inline std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * scale;
  return v;
}

// x rounded to bf16, element by element (lattice::to_bf16).
inline std::vector<lattice::bf16> rounded_to_bf16(const std::vector<float>& x) {
  std::vector<lattice::bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = lattice::to_bf16(x[i]);
  return out;
}

// Weighted sum sum_i w_i * y_i in double: the scalar "loss" whose gradient wrt y is w.
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

// Central finite difference of scalar f() wrt every element of x (x is perturbed and restored).
inline std::vector<double> numerical_gradient(const std::function<double()>& f, float* x, int64_t n,
                                              float step) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float saved = x[i];
    x[i] = saved + step;
    double plus = f();
    x[i] = saved - step;
    double minus = f();
    x[i] = saved;
    // Divide by the step that fp32 actually took.
    double taken = static_cast<double>(saved + step) - static_cast<double>(saved - step);
    g[static_cast<size_t>(i)] = (plus - minus) / taken;
  }
  return g;
}

// max_i |a_i - b_i| / (max_i |b_i| + tiny): error relative to the reference's scale.
template <class A, class B>
double max_relative_error(const A& a, const B& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_diff =
        std::fmax(max_diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    max_ref = std::fmax(max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return max_diff / (max_ref + 1e-30);
}

}  // namespace lattice::testing
