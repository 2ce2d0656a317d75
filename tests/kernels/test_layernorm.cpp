// Tests for the CPU LayerNorm kernels: forward and backward against a naive double-precision
// reference, backward against central finite differences, += semantics of the parameter gradients,
// odd shapes, and bit-identical results for 1, 2 and 3 OpenMP threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/layernorm.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

constexpr float kEps = 1e-5f;

struct Shape {
  int64_t rows;
  int64_t C;
};

// The shapes the brief asks for: single and odd row counts, C of 1, odd, not a multiple of 16,
// GPT-2.
const Shape kShapes[] = {{1, 1}, {3, 1}, {1, 7}, {3, 7}, {3, 33}, {1, 768}, {3, 768}};

struct Reference {
  std::vector<double> out, mean, rstd, d_in, d_weight, d_bias;
};

// Naive double-precision LayerNorm (PyTorch: biased variance, eps inside the sqrt) and its
// gradient.
Reference reference_layernorm(const std::vector<float>& in, const std::vector<float>& weight,
                              const std::vector<float>& bias, const std::vector<float>& d_out,
                              int64_t rows, int64_t C, double eps) {
  Reference ref;
  ref.out.resize(rows * C);
  ref.d_in.resize(rows * C);
  ref.d_weight.assign(C, 0.0);
  ref.d_bias.assign(C, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0;
    for (int64_t c = 0; c < C; ++c) mean += in[r * C + c];
    mean /= C;
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (in[r * C + c] - mean) * (in[r * C + c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + eps);
    ref.mean.push_back(mean);
    ref.rstd.push_back(rstd);
    double sum_dnorm = 0, sum_dnorm_xhat = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (in[r * C + c] - mean) * rstd;
      ref.out[r * C + c] = xhat * weight[c] + bias[c];
      const double dnorm = static_cast<double>(d_out[r * C + c]) * weight[c];
      sum_dnorm += dnorm;
      sum_dnorm_xhat += dnorm * xhat;
      ref.d_weight[c] += static_cast<double>(d_out[r * C + c]) * xhat;
      ref.d_bias[c] += d_out[r * C + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (in[r * C + c] - mean) * rstd;
      const double dnorm = static_cast<double>(d_out[r * C + c]) * weight[c];
      ref.d_in[r * C + c] = rstd * (dnorm - sum_dnorm / C - xhat * sum_dnorm_xhat / C);
    }
  }
  return ref;
}

struct Problem {
  int64_t rows, C;
  std::vector<float> in, weight, bias, d_out;
};

// Inputs with a row offset of 3 (so a one-pass variance would lose digits) and unit spread.
Problem make_problem(int64_t rows, int64_t C, uint64_t seed) {
  Problem p{rows,
            C,
            random_vector(rows * C, seed),
            random_vector(C, seed + 1, 0.5f),
            random_vector(C, seed + 2, 0.5f),
            random_vector(rows * C, seed + 3)};
  for (auto& x : p.in) x += 3.0f;
  for (auto& w : p.weight) w += 1.0f;
  return p;
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 11);
    std::vector<float> out(s.rows * s.C), mean(s.rows), rstd(s.rows);
    layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                      p.bias.data(), s.rows, s.C, kEps);
    Reference ref = reference_layernorm(p.in, p.weight, p.bias, p.d_out, s.rows, s.C, kEps);
    // fp32 sums over C (16 lanes) and a handful of roundings per element: observed <= 2.6e-7 of the
    // output scale (a few ulp); 1e-6 leaves room for other seeds and still catches any formula
    // slip.
    EXPECT_LT(max_relative_error(out, ref.out), 1e-6);
    EXPECT_LT(max_relative_error(mean, ref.mean), 1e-6);
    EXPECT_LT(max_relative_error(rstd, ref.rstd), 1e-6);
  }
}

TEST(LayerNorm, BackwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 23);
    std::vector<float> out(s.rows * s.C), mean(s.rows), rstd(s.rows);
    layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                      p.bias.data(), s.rows, s.C, kEps);
    std::vector<float> d_in(s.rows * s.C), d_weight(s.C, 0.0f), d_bias(s.C, 0.0f);
    layernorm_backward(d_in.data(), d_weight.data(), d_bias.data(), p.d_out.data(), p.in.data(),
                       p.weight.data(), mean.data(), rstd.data(), s.rows, s.C);
    Reference ref = reference_layernorm(p.in, p.weight, p.bias, p.d_out, s.rows, s.C, kEps);
    // d_in subtracts two row means from dnorm: fp32 cancellation costs a few ulp of the row scale
    // (observed <= 1.6e-7); the sums over rows in the parameter grads likewise.
    if (s.C > 1) {
      EXPECT_LT(max_relative_error(d_in, ref.d_in), 2e-6);
    }
    // C = 1: the exact gradient is 0 and the kernel must produce (near) 0, not noise times
    // 1/sqrt(eps).
    if (s.C == 1) {
      for (float g : d_in) EXPECT_LT(std::fabs(g), 1e-3f);
    }
    EXPECT_LT(max_relative_error(d_weight, ref.d_weight), 2e-6);
    EXPECT_LT(max_relative_error(d_bias, ref.d_bias), 2e-6);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  // Loss = sum_i w_i * out_i (in double) through the fp32 forward kernel; central differences with
  // step 1e-2 on unit-scale inputs: truncation O(h^2) ~ 1e-5 of the gradient scale, fp32 rounding
  // of the C outputs of the perturbed row ~ sqrt(C) * 6e-8 / 2h ~ 1e-4 at C = 768 (observed 1.5e-4
  // for d_in at C = 768, <= 7e-5 elsewhere). Tolerance 1e-3. One thread: thousands of tiny calls.
  const float step = 1e-2f;
  const double tolerance = 1e-3;
  testing::ScopedOmpThreads one_thread(1);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 37);
    std::vector<float> out(s.rows * s.C), mean(s.rows), rstd(s.rows);
    auto loss = [&] {
      layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                        p.bias.data(), s.rows, s.C, kEps);
      return testing::weighted_sum(out, p.d_out);
    };
    auto num_d_in = testing::numerical_gradient(loss, p.in.data(), s.rows * s.C, step);
    auto num_d_weight = testing::numerical_gradient(loss, p.weight.data(), s.C, step);
    auto num_d_bias = testing::numerical_gradient(loss, p.bias.data(), s.C, step);

    loss();
    std::vector<float> d_in(s.rows * s.C), d_weight(s.C, 0.0f), d_bias(s.C, 0.0f);
    layernorm_backward(d_in.data(), d_weight.data(), d_bias.data(), p.d_out.data(), p.in.data(),
                       p.weight.data(), mean.data(), rstd.data(), s.rows, s.C);
    if (s.C > 1) {
      EXPECT_LT(max_relative_error(d_in, num_d_in), tolerance);
    } else {
      // C = 1: out = bias whatever the input; both gradients are ~0.
      for (size_t i = 0; i < d_in.size(); ++i) {
        EXPECT_LT(std::fabs(d_in[i]), 1e-3f);
        EXPECT_LT(std::fabs(num_d_in[i]), 1e-3);
      }
    }
    EXPECT_LT(max_relative_error(d_weight, num_d_weight), tolerance);
    EXPECT_LT(max_relative_error(d_bias, num_d_bias), tolerance);
  }
}

TEST(LayerNorm, BackwardAccumulatesParameterGradsAndOverwritesInputGrad) {
  const int64_t rows = 3, C = 33;
  Problem p = make_problem(rows, C, 41);
  std::vector<float> out(rows * C), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                    p.bias.data(), rows, C, kEps);
  std::vector<float> fresh_d_in(rows * C), fresh_d_weight(C, 0.0f), fresh_d_bias(C, 0.0f);
  layernorm_backward(fresh_d_in.data(), fresh_d_weight.data(), fresh_d_bias.data(), p.d_out.data(),
                     p.in.data(), p.weight.data(), mean.data(), rstd.data(), rows, C);

  const std::vector<float> prior_weight = random_vector(C, 43), prior_bias = random_vector(C, 47);
  std::vector<float> d_in(rows * C, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> d_weight = prior_weight, d_bias = prior_bias;
  layernorm_backward(d_in.data(), d_weight.data(), d_bias.data(), p.d_out.data(), p.in.data(),
                     p.weight.data(), mean.data(), rstd.data(), rows, C);
  EXPECT_EQ(0, std::memcmp(d_in.data(), fresh_d_in.data(), d_in.size() * sizeof(float)));
  for (int64_t c = 0; c < C; ++c) {
    // prior + gradient, rounded once or twice in fp32: within 1 ulp of the two-step sum.
    const float expected_weight = prior_weight[c] + fresh_d_weight[c];
    const float expected_bias = prior_bias[c] + fresh_d_bias[c];
    EXPECT_NEAR(d_weight[c], expected_weight, 2e-7f * (1.0f + std::fabs(expected_weight)));
    EXPECT_NEAR(d_bias[c], expected_bias, 2e-7f * (1.0f + std::fabs(expected_bias)));
  }
}

TEST(LayerNorm, BackwardWithResidualGradientEqualsBackwardThenAdd) {
  // A residual connection's gradient added in the same pass: bit for bit the separate add (the
  // kernel must not let the compiler contract it into the last multiply), parameter gradients
  // unchanged.
  const int64_t rows = 37, C = 200;
  Problem p = make_problem(rows, C, 61);
  std::vector<float> out(rows * C), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                    p.bias.data(), rows, C, kEps);
  const std::vector<float> residual = random_vector(rows * C, 67);
  std::vector<float> d_in(rows * C), d_weight(C, 0.0f), d_bias(C, 0.0f);
  layernorm_backward(d_in.data(), d_weight.data(), d_bias.data(), p.d_out.data(), p.in.data(),
                     p.weight.data(), mean.data(), rstd.data(), rows, C);
  add_inplace(d_in.data(), residual.data(), rows * C);
  std::vector<float> fused(rows * C), fused_weight(C, 0.0f), fused_bias(C, 0.0f);
  layernorm_backward(fused.data(), fused_weight.data(), fused_bias.data(), p.d_out.data(),
                     p.in.data(), p.weight.data(), mean.data(), rstd.data(), rows, C,
                     residual.data());
  EXPECT_EQ(fused, d_in);
  EXPECT_EQ(fused_weight, d_weight);
  EXPECT_EQ(fused_bias, d_bias);
}

TEST(LayerNorm, BitIdenticalForAnyThreadCount) {
  // Enough rows for many fixed row chunks (1037 rows, C = 768).
  const int64_t rows = 1037, C = 768;
  Problem p = make_problem(rows, C, 53);
  std::vector<float> baseline_out, baseline_d_in, baseline_d_weight, baseline_d_bias;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    testing::ScopedOmpThreads scoped(threads);
    std::vector<float> out(rows * C), mean(rows), rstd(rows);
    layernorm_forward(out.data(), mean.data(), rstd.data(), p.in.data(), p.weight.data(),
                      p.bias.data(), rows, C, kEps);
    std::vector<float> d_in(rows * C), d_weight(C, 0.5f), d_bias(C, -0.25f);
    layernorm_backward(d_in.data(), d_weight.data(), d_bias.data(), p.d_out.data(), p.in.data(),
                       p.weight.data(), mean.data(), rstd.data(), rows, C);
    if (threads == 1) {
      baseline_out = out;
      baseline_d_in = d_in;
      baseline_d_weight = d_weight;
      baseline_d_bias = d_bias;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(out.data(), baseline_out.data(), out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_in.data(), baseline_d_in.data(), d_in.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_weight.data(), baseline_d_weight.data(), C * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_bias.data(), baseline_d_bias.data(), C * sizeof(float)));
  }
}

TEST(LayerNorm, ResultsDoNotDependOnRowAddress) {
  // Parity across ranks needs the same row to give the same bits wherever it sits in memory: a
  // vectoriser that peeled iterations to align the row would change the summation order.
  const int64_t rows = 2, C = 777;
  Problem p = make_problem(rows, C, 59);
  std::vector<float> baseline;
  for (int64_t shift = 0; shift < 16; ++shift) {
    SCOPED_TRACE(::testing::Message() << "shift=" << shift << " floats");
    std::vector<float> in(rows * C + shift), d_out(rows * C + shift), out(rows * C + shift),
        d_in(rows * C + shift), mean(rows), rstd(rows), d_weight(C, 0.0f), d_bias(C, 0.0f);
    std::copy(p.in.begin(), p.in.end(), in.begin() + shift);
    std::copy(p.d_out.begin(), p.d_out.end(), d_out.begin() + shift);
    layernorm_forward(out.data() + shift, mean.data(), rstd.data(), in.data() + shift,
                      p.weight.data(), p.bias.data(), rows, C, kEps);
    layernorm_backward(d_in.data() + shift, d_weight.data(), d_bias.data(), d_out.data() + shift,
                       in.data() + shift, p.weight.data(), mean.data(), rstd.data(), rows, C);
    std::vector<float> results(out.begin() + shift, out.end());
    results.insert(results.end(), d_in.begin() + shift, d_in.end());
    for (const auto* v : {&mean, &rstd, &d_weight, &d_bias}) {
      results.insert(results.end(), v->begin(), v->end());
    }
    if (shift == 0) {
      baseline = results;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(results.data(), baseline.data(), results.size() * sizeof(float)));
  }
}

TEST(LayerNorm, RejectsNonPositiveChannels) {
  float x = 0;
  EXPECT_THROW(layernorm_forward(&x, &x, &x, &x, &x, &x, 1, 0, kEps), Error);
}

}  // namespace
}  // namespace lattice::kernels
