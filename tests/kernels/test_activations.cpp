// Tests for the CPU GELU (tanh form) and SwiGLU kernels: forward and backward against naive
// double-precision references of PyTorch's formulas, backward against central finite differences,
// overwrite semantics, odd sizes (including one large enough to run threaded), extreme inputs and
// bit-identical results for 1, 2 and 3 OpenMP threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

// 1, odd, not a multiple of 16, GPT-2's width, and one above the kernels' threading threshold.
const int64_t kSizes[] = {1, 7, 33, 768, 100003};

// PyTorch gelu(approximate="tanh") in double.
double reference_gelu(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double reference_gelu_derivative(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
double reference_sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Elementwise |a - b| <= rtol * |b| + atol. The fp32 kernels evaluate u = k (x + 0.044715 x^3) with
// a few ulp of relative error; e^(-2u) turns that into 2|u| * 2.4e-7 relative error, so up to ~2e-6
// for |x| <= 6 where outputs are not negligible: rtol = 4e-6. atol = 1e-7 covers tails whose exact
// value is below 1e-7 (those deep in the negative tail).
void expect_close_elementwise(const std::vector<float>& actual, const std::vector<double>& expected,
                              double rtol, double atol) {
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], rtol * std::fabs(expected[i]) + atol) << "at i=" << i;
  }
}

// Random inputs of spread 3 plus a sweep of [-12, 12], so both tails and the bend are covered.
std::vector<float> activation_inputs(int64_t n, uint64_t seed) {
  std::vector<float> x = random_vector(n, seed, 3.0f);
  for (int64_t i = 0; i < n; i += 2) x[i] = -12.0f + 24.0f * static_cast<float>(i) / n;
  return x;
}

TEST(Gelu, ForwardMatchesDoubleReference) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = activation_inputs(n, 3);
    std::vector<float> y(n);
    gelu_forward(y.data(), x.data(), n);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = reference_gelu(x[i]);
    expect_close_elementwise(y, expected, 4e-6, 1e-7);
  }
}

TEST(Gelu, BackwardMatchesDoubleReferenceAndOverwrites) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = activation_inputs(n, 5);
    const std::vector<float> d_out = random_vector(n, 7);
    std::vector<float> d_in(n, std::numeric_limits<float>::quiet_NaN());
    gelu_backward(d_in.data(), d_out.data(), x.data(), n);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = d_out[i] * reference_gelu_derivative(x[i]);
    // Same error budget as the forward (the derivative has the same e^(-2u) factor); the absolute
    // floor is larger because s + 2x s (1 - s) u' cancels near its zero at x ~ -0.75 (terms ~0.5)
    // and d_out ~ N(0,1) scales it.
    expect_close_elementwise(d_in, expected, 4e-6, 4e-7);
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  // Loss = sum_i w_i gelu(x_i) through the fp32 forward; central differences with step 1e-2:
  // truncation h^2 / 6 * |gelu'''| <= 2e-5, fp32 rounding of one output / 2h ~ 3e-6 * |y|
  // (observed <= 1.5e-5). Tolerance 2e-4 of the gradient scale.
  testing::ScopedOmpThreads one_thread(1);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{768}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> x = random_vector(n, 11, 2.0f);
    const std::vector<float> w = random_vector(n, 13);
    std::vector<float> y(n);
    auto loss = [&] {
      gelu_forward(y.data(), x.data(), n);
      return testing::weighted_sum(y, w);
    };
    const std::vector<double> numerical = testing::numerical_gradient(loss, x.data(), n, 1e-2f);
    std::vector<float> d_in(n);
    gelu_backward(d_in.data(), w.data(), x.data(), n);
    EXPECT_LT(max_relative_error(d_in, numerical), 2e-4);
  }
}

TEST(Gelu, ExtremeInputsStayFinite) {
  const std::vector<float> x = {-1e5f, -100.0f, -30.0f, -10.0f, 0.0f, 10.0f, 30.0f, 100.0f, 1e5f};
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), d_in(n);
  const std::vector<float> ones(n, 1.0f);
  gelu_forward(y.data(), x.data(), n);
  gelu_backward(d_in.data(), ones.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE(::testing::Message() << "x=" << x[i]);
    // Exact values: x for large positive x, 0 for large negative x (gelu(-10) ~ -1e-37).
    EXPECT_TRUE(std::isfinite(y[i]));
    EXPECT_NEAR(y[i], reference_gelu(x[i]), 1e-6 * std::fabs(x[i]) + 1e-30);
    if (std::fabs(x[i]) <= 100.0f) {
      EXPECT_TRUE(std::isfinite(d_in[i]));
      EXPECT_NEAR(d_in[i], reference_gelu_derivative(x[i]), 1e-6);
    }
  }
}

TEST(SwiGlu, ForwardMatchesDoubleReference) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> gate = activation_inputs(n, 17);
    const std::vector<float> up = random_vector(n, 19);
    std::vector<float> y(n);
    swiglu_forward(y.data(), gate.data(), up.data(), n);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      expected[i] = gate[i] * reference_sigmoid(gate[i]) * static_cast<double>(up[i]);
    }
    // e^(-g) is exact to ~1 ulp (g is an input, not a rounded product), then 3 roundings: rtol
    // 1e-6; atol 1e-7 for the negative tail (silu(-12) = -7e-5 times up).
    expect_close_elementwise(y, expected, 1e-6, 1e-7);
  }
}

TEST(SwiGlu, BackwardMatchesDoubleReferenceAndOverwrites) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> gate = activation_inputs(n, 23);
    const std::vector<float> up = random_vector(n, 29);
    const std::vector<float> d_out = random_vector(n, 31);
    std::vector<float> d_gate(n, std::numeric_limits<float>::quiet_NaN());
    std::vector<float> d_up(n, std::numeric_limits<float>::quiet_NaN());
    swiglu_backward(d_gate.data(), d_up.data(), d_out.data(), gate.data(), up.data(), n);
    std::vector<double> expected_gate(n), expected_up(n);
    for (int64_t i = 0; i < n; ++i) {
      const double s = reference_sigmoid(gate[i]);
      expected_gate[i] = static_cast<double>(d_out[i]) * up[i] * s * (1.0 + gate[i] * (1.0 - s));
      expected_up[i] = static_cast<double>(d_out[i]) * gate[i] * s;
    }
    // A few roundings on products of three N(0,1)-scale factors: rtol 2e-6, atol 4e-7.
    expect_close_elementwise(d_gate, expected_gate, 2e-6, 4e-7);
    expect_close_elementwise(d_up, expected_up, 2e-6, 4e-7);
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  // Loss = sum_i w_i silu(gate_i) up_i through the fp32 forward; step 1e-2, tolerance 2e-4 of the
  // gradient scale (truncation h^2/6 |f'''| <= 2e-5, rounding ~3e-6 * |y|; observed <= 1.1e-5).
  testing::ScopedOmpThreads one_thread(1);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{768}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> gate = random_vector(n, 37, 2.0f);
    std::vector<float> up = random_vector(n, 41);
    const std::vector<float> w = random_vector(n, 43);
    std::vector<float> y(n);
    auto loss = [&] {
      swiglu_forward(y.data(), gate.data(), up.data(), n);
      return testing::weighted_sum(y, w);
    };
    const auto numerical_gate = testing::numerical_gradient(loss, gate.data(), n, 1e-2f);
    const auto numerical_up = testing::numerical_gradient(loss, up.data(), n, 1e-2f);
    std::vector<float> d_gate(n), d_up(n);
    swiglu_backward(d_gate.data(), d_up.data(), w.data(), gate.data(), up.data(), n);
    EXPECT_LT(max_relative_error(d_gate, numerical_gate), 2e-4);
    EXPECT_LT(max_relative_error(d_up, numerical_up), 2e-4);
  }
}

TEST(SwiGlu, ExtremeGatesStayFinite) {
  const std::vector<float> gate = {-1e5f, -100.0f, -30.0f, 0.0f, 30.0f, 100.0f, 1e5f};
  const int64_t n = static_cast<int64_t>(gate.size());
  const std::vector<float> up(n, 2.0f), d_out(n, 1.0f);
  std::vector<float> y(n), d_gate(n), d_up(n);
  swiglu_forward(y.data(), gate.data(), up.data(), n);
  swiglu_backward(d_gate.data(), d_up.data(), d_out.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE(::testing::Message() << "gate=" << gate[i]);
    const double s = reference_sigmoid(gate[i]);
    // silu(g) -> g for large g and -> 0 for very negative g; silu'(g) -> 1 and 0.
    EXPECT_NEAR(y[i], 2.0 * gate[i] * s, 1e-6 * std::fabs(gate[i]) + 1e-30);
    EXPECT_NEAR(d_up[i], gate[i] * s, 1e-6 * std::fabs(gate[i]) + 1e-30);
    EXPECT_NEAR(d_gate[i], 2.0 * s * (1.0 + gate[i] * (1.0 - s)), 1e-6);
  }
}

TEST(Activations, BitIdenticalForAnyThreadCount) {
  const int64_t n = 100003;  // above the threading threshold
  const std::vector<float> x = activation_inputs(n, 47), up = random_vector(n, 53);
  const std::vector<float> d_out = random_vector(n, 59);
  std::vector<float> baseline;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    testing::ScopedOmpThreads scoped(threads);
    std::vector<float> results(5 * n);
    gelu_forward(results.data(), x.data(), n);
    gelu_backward(results.data() + n, d_out.data(), x.data(), n);
    swiglu_forward(results.data() + 2 * n, x.data(), up.data(), n);
    swiglu_backward(results.data() + 3 * n, results.data() + 4 * n, d_out.data(), x.data(),
                    up.data(), n);
    if (threads == 1) {
      baseline = results;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(results.data(), baseline.data(), results.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace lattice::kernels
