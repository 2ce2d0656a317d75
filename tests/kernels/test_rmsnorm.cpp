// Tests for the CPU RMSNorm kernels: forward and backward against a naive double-precision
// reference (Hugging Face LlamaRMSNorm), backward against central finite differences, += semantics
// of d_weight, odd shapes, and bit-identical results for 1, 2 and 3 OpenMP threads; the bf16-output
// forward against the rounded fp32 one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/rmsnorm.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

constexpr float kEps = 1e-6f;  // Llama's rms_norm_eps

struct Shape {
  int64_t rows;
  int64_t C;
};

const Shape kShapes[] = {{1, 1}, {3, 1}, {1, 7}, {3, 7}, {3, 33}, {1, 768}, {3, 768}};

struct Reference {
  std::vector<double> out, rstd, d_in, d_weight;
};

// Naive double-precision RMSNorm: out = weight * x / sqrt(mean(x^2) + eps), and its gradient.
Reference reference_rmsnorm(const std::vector<float>& in, const std::vector<float>& weight,
                            const std::vector<float>& d_out, int64_t rows, int64_t C, double eps) {
  Reference ref;
  ref.out.resize(rows * C);
  ref.d_in.resize(rows * C);
  ref.d_weight.assign(C, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean_square = 0;
    for (int64_t c = 0; c < C; ++c)
      mean_square += static_cast<double>(in[r * C + c]) * in[r * C + c];
    mean_square /= C;
    const double rstd = 1.0 / std::sqrt(mean_square + eps);
    ref.rstd.push_back(rstd);
    double sum_dnorm_xhat = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = in[r * C + c] * rstd;
      ref.out[r * C + c] = xhat * weight[c];
      sum_dnorm_xhat += static_cast<double>(d_out[r * C + c]) * weight[c] * xhat;
      ref.d_weight[c] += static_cast<double>(d_out[r * C + c]) * xhat;
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = in[r * C + c] * rstd;
      ref.d_in[r * C + c] =
          rstd * (static_cast<double>(d_out[r * C + c]) * weight[c] - xhat * sum_dnorm_xhat / C);
    }
  }
  return ref;
}

struct Problem {
  int64_t rows, C;
  std::vector<float> in, weight, d_out;
};

Problem make_problem(int64_t rows, int64_t C, uint64_t seed) {
  Problem p{rows, C, random_vector(rows * C, seed, 2.0f), random_vector(C, seed + 1, 0.5f),
            random_vector(rows * C, seed + 3)};
  for (auto& w : p.weight) w += 1.0f;
  return p;
}

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 101);
    std::vector<float> out(s.rows * s.C), rstd(s.rows);
    rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), s.rows, s.C, kEps);
    Reference ref = reference_rmsnorm(p.in, p.weight, p.d_out, s.rows, s.C, kEps);
    // A 16-lane fp32 sum of squares and three roundings per element: a few ulp (observed ~2e-7).
    EXPECT_LT(max_relative_error(out, ref.out), 1e-6);
    EXPECT_LT(max_relative_error(rstd, ref.rstd), 1e-6);
  }
}

TEST(RmsNorm, BackwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 103);
    std::vector<float> out(s.rows * s.C), rstd(s.rows);
    rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), s.rows, s.C, kEps);
    std::vector<float> d_in(s.rows * s.C), d_weight(s.C, 0.0f);
    rmsnorm_backward(d_in.data(), d_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                     rstd.data(), s.rows, s.C);
    Reference ref = reference_rmsnorm(p.in, p.weight, p.d_out, s.rows, s.C, kEps);
    // One fp32 cancellation (dnorm - xhat * mean) per element: a few ulp of the row's scale.
    if (s.C > 1) {
      EXPECT_LT(max_relative_error(d_in, ref.d_in), 2e-6);
    } else {
      // C = 1: d_in = rstd * dnorm * (1 - xhat^2) with 1 - xhat^2 = eps / (x^2 + eps) ~ 1e-7, far
      // below fp32 resolution of xhat^2 ~ 1: the error is a few ulp of rstd * dnorm, not of d_in.
      for (int64_t r = 0; r < s.rows; ++r) {
        const double uncancelled = std::fabs(rstd[r] * p.d_out[r] * p.weight[0]);
        EXPECT_NEAR(d_in[r], ref.d_in[r], 4 * 6e-8 * uncancelled);
      }
    }
    EXPECT_LT(max_relative_error(d_weight, ref.d_weight), 2e-6);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  // Loss = sum_i w_i * out_i (in double) through the fp32 forward kernel; central differences with
  // step 1e-2 on inputs of scale 2 and weights of scale 1: truncation O(h^2) ~ 1e-5, fp32 rounding
  // of the perturbed row's C outputs ~ sqrt(C) * 6e-8 / 2h ~ 1e-4 at C = 768. Tolerance 1e-3. One
  // thread: thousands of tiny calls.
  const float step = 1e-2f;
  const double tolerance = 1e-3;
  testing::ScopedOmpThreads one_thread(1);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 107);
    std::vector<float> out(s.rows * s.C), rstd(s.rows);
    auto loss = [&] {
      rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), s.rows, s.C, kEps);
      return testing::weighted_sum(out, p.d_out);
    };
    auto num_d_in = testing::numerical_gradient(loss, p.in.data(), s.rows * s.C, step);
    auto num_d_weight = testing::numerical_gradient(loss, p.weight.data(), s.C, step);

    loss();
    std::vector<float> d_in(s.rows * s.C), d_weight(s.C, 0.0f);
    rmsnorm_backward(d_in.data(), d_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                     rstd.data(), s.rows, s.C);
    if (s.C > 1) {
      EXPECT_LT(max_relative_error(d_in, num_d_in), tolerance);
    } else {
      // C = 1: out = weight * sign(x) (up to eps), so d out / d x ~ 0 away from x = 0.
      for (size_t i = 0; i < d_in.size(); ++i) {
        EXPECT_LT(std::fabs(d_in[i]), 1e-3f);
        EXPECT_LT(std::fabs(num_d_in[i]), 1e-3);
      }
    }
    EXPECT_LT(max_relative_error(d_weight, num_d_weight), tolerance);
  }
}

TEST(RmsNorm, BackwardAccumulatesWeightGradAndOverwritesInputGrad) {
  const int64_t rows = 3, C = 33;
  Problem p = make_problem(rows, C, 109);
  std::vector<float> out(rows * C), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), rows, C, kEps);
  std::vector<float> fresh_d_in(rows * C), fresh_d_weight(C, 0.0f);
  rmsnorm_backward(fresh_d_in.data(), fresh_d_weight.data(), p.d_out.data(), p.in.data(),
                   p.weight.data(), rstd.data(), rows, C);

  const std::vector<float> prior = random_vector(C, 113);
  std::vector<float> d_in(rows * C, std::numeric_limits<float>::quiet_NaN()), d_weight = prior;
  rmsnorm_backward(d_in.data(), d_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                   rstd.data(), rows, C);
  EXPECT_EQ(0, std::memcmp(d_in.data(), fresh_d_in.data(), d_in.size() * sizeof(float)));
  for (int64_t c = 0; c < C; ++c) {
    // prior + gradient, rounded once (kernel) or twice (here) in fp32: within 1 ulp.
    const float expected = prior[c] + fresh_d_weight[c];
    EXPECT_NEAR(d_weight[c], expected, 2e-7f * (1.0f + std::fabs(expected)));
  }
}

TEST(RmsNorm, BackwardWithResidualGradientEqualsBackwardThenAdd) {
  // As LayerNorm's: the residual's gradient added in the same pass, bit for bit a separate add.
  const int64_t rows = 37, C = 200;
  Problem p = make_problem(rows, C, 131);
  std::vector<float> out(rows * C), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), rows, C, kEps);
  const std::vector<float> residual = random_vector(rows * C, 137);
  std::vector<float> d_in(rows * C), d_weight(C, 0.0f);
  rmsnorm_backward(d_in.data(), d_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                   rstd.data(), rows, C);
  add_inplace(d_in.data(), residual.data(), rows * C);
  std::vector<float> fused(rows * C), fused_weight(C, 0.0f);
  rmsnorm_backward(fused.data(), fused_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                   rstd.data(), rows, C, residual.data());
  EXPECT_EQ(fused, d_in);
  EXPECT_EQ(fused_weight, d_weight);
}

TEST(RmsNorm, BitIdenticalForAnyThreadCount) {
  const int64_t rows = 1037, C = 768;
  Problem p = make_problem(rows, C, 127);
  std::vector<float> baseline_out, baseline_d_in, baseline_d_weight;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    testing::ScopedOmpThreads scoped(threads);
    std::vector<float> out(rows * C), rstd(rows);
    rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), rows, C, kEps);
    std::vector<float> d_in(rows * C), d_weight(C, 0.5f);
    rmsnorm_backward(d_in.data(), d_weight.data(), p.d_out.data(), p.in.data(), p.weight.data(),
                     rstd.data(), rows, C);
    if (threads == 1) {
      baseline_out = out;
      baseline_d_in = d_in;
      baseline_d_weight = d_weight;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(out.data(), baseline_out.data(), out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_in.data(), baseline_d_in.data(), d_in.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_weight.data(), baseline_d_weight.data(), C * sizeof(float)));
  }
}

TEST(RmsNorm, ResultsDoNotDependOnRowAddress) {
  // Parity across ranks needs the same row to give the same bits wherever it sits in memory: a
  // vectoriser that peeled iterations to align the row would change the summation order.
  const int64_t rows = 2, C = 777;
  Problem p = make_problem(rows, C, 131);
  std::vector<float> baseline;
  for (int64_t shift = 0; shift < 16; ++shift) {
    SCOPED_TRACE(::testing::Message() << "shift=" << shift << " floats");
    std::vector<float> in(rows * C + shift), d_out(rows * C + shift), out(rows * C + shift),
        d_in(rows * C + shift), rstd(rows), d_weight(C, 0.0f);
    std::copy(p.in.begin(), p.in.end(), in.begin() + shift);
    std::copy(p.d_out.begin(), p.d_out.end(), d_out.begin() + shift);
    rmsnorm_forward(out.data() + shift, rstd.data(), in.data() + shift, p.weight.data(), rows, C,
                    kEps);
    rmsnorm_backward(d_in.data() + shift, d_weight.data(), d_out.data() + shift, in.data() + shift,
                     p.weight.data(), rstd.data(), rows, C);
    std::vector<float> results(out.begin() + shift, out.end());
    results.insert(results.end(), d_in.begin() + shift, d_in.end());
    results.insert(results.end(), rstd.begin(), rstd.end());
    results.insert(results.end(), d_weight.begin(), d_weight.end());
    if (shift == 0) {
      baseline = results;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(results.data(), baseline.data(), results.size() * sizeof(float)));
  }
}

TEST(RmsNorm, RejectsNonPositiveChannels) {
  float x = 0;
  EXPECT_THROW(rmsnorm_forward(&x, &x, &x, &x, 1, 0, kEps), Error);
}

TEST(RmsNorm, ForwardBf16IsTheRoundedFp32ForwardWithTheSameRstd) {
  // Bit for bit lattice::to_bf16 of rmsnorm_forward's output, with the same rstd, for any thread
  // count (the fused bf16 path of Llama's norms must not change a training run's bits).
  for (const Shape& s :
       {Shape{37, 1}, Shape{37, 17}, Shape{37, 256}, Shape{1037, 768}, Shape{5, 1000}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " C=" << s.C);
    Problem p = make_problem(s.rows, s.C, 139);
    std::vector<float> out(s.rows * s.C), rstd(s.rows);
    rmsnorm_forward(out.data(), rstd.data(), p.in.data(), p.weight.data(), s.rows, s.C, kEps);
    std::vector<uint16_t> expected(out.size());
    for (size_t i = 0; i < out.size(); ++i) expected[i] = lattice::to_bf16(out[i]).bits;
    for (int threads : {1, 2, 3}) {
      testing::ScopedOmpThreads scoped(threads);
      std::vector<lattice::bf16> out16(out.size());
      std::vector<float> rstd16(s.rows, -1.0f);
      rmsnorm_forward_bf16(out16.data(), rstd16.data(), p.in.data(), p.weight.data(), s.rows, s.C,
                           kEps);
      std::vector<uint16_t> bits(out16.size());
      for (size_t i = 0; i < out16.size(); ++i) bits[i] = out16[i].bits;
      EXPECT_EQ(bits, expected) << threads << " threads";
      EXPECT_EQ(0, std::memcmp(rstd16.data(), rstd.data(), rstd.size() * sizeof(float)))
          << threads << " threads";
    }
  }
}

TEST(RmsNorm, ForwardBf16RejectsAnEmptyRow) {
  std::vector<lattice::bf16> out(1);
  std::vector<float> rstd(1), in(1), weight(1);
  EXPECT_THROW(rmsnorm_forward_bf16(out.data(), rstd.data(), in.data(), weight.data(), 1, 0, kEps),
               Error);
}

}  // namespace
}  // namespace lattice::kernels
