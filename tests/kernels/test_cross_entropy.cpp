// Tests for the CPU fused softmax + cross-entropy: loss and gradient against a double-precision
// logsumexp reference, gradient against finite differences of the loss, ignored (negative) targets,
// in-place gradients, grad_scale, logits far beyond exp's range, bad targets, and bit-identical
// results for 1, 2 and 3 OpenMP threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

struct Shape {
  int64_t rows, V;
};

// One and odd row counts; V of 1, odd, not a multiple of 16, 768, and GPT-2's vocabulary.
const Shape kShapes[] = {{1, 1}, {3, 1}, {1, 7}, {3, 33}, {5, 768}, {3, 50257}};

struct Reference {
  double loss = 0;               // sum over non-ignored rows
  std::vector<double> d_logits;  // (softmax - onehot) * grad_scale, 0 on ignored rows
};

Reference reference_cross_entropy(const std::vector<float>& logits,
                                  const std::vector<int32_t>& targets, int64_t rows, int64_t V,
                                  double grad_scale) {
  Reference ref;
  ref.d_logits.assign(rows * V, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    const float* x = logits.data() + r * V;
    double max = x[0];
    for (int64_t v = 0; v < V; ++v) max = std::fmax(max, x[v]);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - max);
    ref.loss += max + std::log(sum) - x[targets[r]];
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(x[v] - max) / sum;
      ref.d_logits[r * V + v] = (p - (v == targets[r] ? 1.0 : 0.0)) * grad_scale;
    }
  }
  return ref;
}

// Targets uniform in [0, V); with 3 or more rows, row 1 is ignored (-1) to exercise that path.
std::vector<int32_t> make_targets(int64_t rows, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> targets(rows);
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(V));
  if (rows >= 3) targets[1] = -1;
  return targets;
}

// |loss - ref| for a sum of row losses: per row, ~1e-7 relative error of the fp32 sum of exps
// (fast_exp is within ~1 ulp, blocks of 32 terms per lane) plus fp32 logits exact in double: ~1e-7
// absolute per row (observed <= 2e-7 per call). Bound 1e-6 per row.
void expect_loss_near(double loss, double reference, int64_t rows) {
  EXPECT_NEAR(loss, reference, 1e-6 * static_cast<double>(rows) + 1e-7 * std::fabs(reference));
}

TEST(CrossEntropy, ForwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " V=" << s.V);
    const auto logits = random_vector(s.rows * s.V, 1, 2.0f);
    const auto targets = make_targets(s.rows, s.V, 2);
    const Reference ref = reference_cross_entropy(logits, targets, s.rows, s.V, 1.0);
    expect_loss_near(cross_entropy_forward(logits.data(), targets.data(), s.rows, s.V), ref.loss,
                     s.rows);
  }
}

TEST(CrossEntropy, ForwardBackwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    for (float grad_scale : {1.0f, 1.0f / 3.0f, -2.5f}) {
      SCOPED_TRACE(::testing::Message()
                   << "rows=" << s.rows << " V=" << s.V << " grad_scale=" << grad_scale);
      const auto logits = random_vector(s.rows * s.V, 3, 2.0f);
      const auto targets = make_targets(s.rows, s.V, 4);
      std::vector<float> d_logits(s.rows * s.V, std::numeric_limits<float>::quiet_NaN());
      const double loss = cross_entropy_forward_backward(d_logits.data(), logits.data(),
                                                         targets.data(), s.rows, s.V, grad_scale);
      const Reference ref = reference_cross_entropy(logits, targets, s.rows, s.V, grad_scale);
      expect_loss_near(loss, ref.loss, s.rows);
      // Same arithmetic as the forward-only call: the same loss to the bit.
      EXPECT_EQ(loss, cross_entropy_forward(logits.data(), targets.data(), s.rows, s.V));
      // Probabilities carry ~2e-7 relative error (exp, the sum, one division); the target entry
      // p - 1 is rounded at the scale of 1 (observed <= 9e-8). Elementwise bound 4e-7 *
      // |grad_scale|.
      for (int64_t i = 0; i < s.rows * s.V; ++i) {
        ASSERT_NEAR(d_logits[i], ref.d_logits[i], 4e-7 * std::fabs(grad_scale)) << "at i=" << i;
      }
    }
  }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  // f = grad_scale * (sum of row losses) from the forward kernel; d f / d logits is the gradient
  // written by forward_backward. Central differences, step 1e-2 on logits of spread 2: truncation
  // h^2 / 6 * |f'''| ~ 2e-6; the loss' rounding (~1e-7 per row) / 2h ~ 5e-6 (observed <= 6.5e-6).
  // Tolerance 1e-4 of the largest gradient entry (the target's, ~1).
  testing::ScopedOmpThreads one_thread(1);
  const float grad_scale = 0.5f;
  for (const Shape& s : {Shape{1, 1}, Shape{3, 7}, Shape{3, 33}, Shape{1, 768}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " V=" << s.V);
    auto logits = random_vector(s.rows * s.V, 5, 2.0f);
    const auto targets = make_targets(s.rows, s.V, 6);
    auto loss = [&] {
      return grad_scale * cross_entropy_forward(logits.data(), targets.data(), s.rows, s.V);
    };
    const auto numerical = testing::numerical_gradient(loss, logits.data(), s.rows * s.V, 1e-2f);
    std::vector<float> d_logits(s.rows * s.V);
    cross_entropy_forward_backward(d_logits.data(), logits.data(), targets.data(), s.rows, s.V,
                                   grad_scale);
    if (s.V == 1) {
      // One class: loss 0 and gradient 0 whatever the logit.
      for (size_t i = 0; i < d_logits.size(); ++i) {
        EXPECT_EQ(d_logits[i], 0.0f);
        EXPECT_NEAR(numerical[i], 0.0, 1e-6);
      }
    } else {
      EXPECT_LT(max_relative_error(d_logits, numerical), 1e-4);
    }
  }
}

TEST(CrossEntropy, IgnoredTargetsGiveZeroLossAndZeroGradient) {
  const int64_t rows = 4, V = 33;
  const auto logits = random_vector(rows * V, 7, 2.0f);
  const std::vector<int32_t> targets = {3, -1, -100, 32};
  std::vector<float> d_logits(rows * V, std::numeric_limits<float>::quiet_NaN());
  const double loss =
      cross_entropy_forward_backward(d_logits.data(), logits.data(), targets.data(), rows, V, 1.0f);
  const Reference ref = reference_cross_entropy(logits, targets, rows, V, 1.0);
  expect_loss_near(loss, ref.loss, rows);
  for (int64_t r : {1, 2}) {
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d_logits[r * V + v], 0.0f);
  }
  // Every row ignored: loss exactly 0.
  const std::vector<int32_t> all_ignored(rows, -1);
  EXPECT_EQ(cross_entropy_forward_backward(d_logits.data(), logits.data(), all_ignored.data(), rows,
                                           V, 1.0f),
            0.0);
  for (float g : d_logits) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropy, InPlaceGradientEqualsOutOfPlace) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " V=" << s.V);
    const auto logits = random_vector(s.rows * s.V, 8, 2.0f);
    const auto targets = make_targets(s.rows, s.V, 9);
    std::vector<float> d_logits(s.rows * s.V);
    const double loss = cross_entropy_forward_backward(d_logits.data(), logits.data(),
                                                       targets.data(), s.rows, s.V, 0.25f);
    std::vector<float> in_place = logits;
    const double in_place_loss = cross_entropy_forward_backward(in_place.data(), in_place.data(),
                                                                targets.data(), s.rows, s.V, 0.25f);
    EXPECT_EQ(loss, in_place_loss);
    EXPECT_EQ(0, std::memcmp(in_place.data(), d_logits.data(), d_logits.size() * sizeof(float)));
  }
}

TEST(CrossEntropy, LargeLogitsDoNotOverflow) {
  // Rows whose naive exp overflows fp32 (e^89 > FLT_MAX) or underflows entirely (all below -104).
  const int64_t V = 257;
  const int64_t rows = 4;
  std::vector<float> logits = random_vector(rows * V, 10, 1.0f);
  for (int64_t v = 0; v < V; ++v) {
    logits[0 * V + v] = 1e4f + logits[0 * V + v];    // large offset, unit spread
    logits[1 * V + v] = 300.0f * logits[1 * V + v];  // spread far beyond exp's range
    logits[2 * V + v] = -1e4f + logits[2 * V + v];   // every naive exp underflows
    logits[3 * V + v] = v == 5 ? 3e38f : -3e38f;     // near FLT_MAX, one winner
  }
  const std::vector<int32_t> targets = {17, 200, 3, 5};
  std::vector<float> d_logits(rows * V);
  const double loss =
      cross_entropy_forward_backward(d_logits.data(), logits.data(), targets.data(), rows, V, 1.0f);
  const Reference ref = reference_cross_entropy(logits, targets, rows, V, 1.0);
  ASSERT_TRUE(std::isfinite(loss));
  // Row 1's loss is ~1e3 (its logits are ~300 apart): fp32 logits are exact, the max cancels
  // exactly.
  expect_loss_near(loss, ref.loss, rows);
  for (int64_t i = 0; i < rows * V; ++i) {
    ASSERT_TRUE(std::isfinite(d_logits[i])) << "at i=" << i;
    ASSERT_NEAR(d_logits[i], ref.d_logits[i], 4e-7) << "at i=" << i;
  }
}

TEST(CrossEntropy, BitIdenticalForAnyThreadCount) {
  const int64_t rows = 67, V = 1031;
  const auto logits = random_vector(rows * V, 11, 3.0f);
  const auto targets = make_targets(rows, V, 12);
  double baseline_loss = 0, baseline_forward_loss = 0;
  std::vector<float> baseline_d_logits;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    testing::ScopedOmpThreads scoped(threads);
    std::vector<float> d_logits(rows * V);
    const double loss = cross_entropy_forward_backward(d_logits.data(), logits.data(),
                                                       targets.data(), rows, V, 1.0f / rows);
    const double forward_loss = cross_entropy_forward(logits.data(), targets.data(), rows, V);
    if (threads == 1) {
      baseline_loss = loss;
      baseline_forward_loss = forward_loss;
      baseline_d_logits = d_logits;
      continue;
    }
    EXPECT_EQ(loss, baseline_loss);
    EXPECT_EQ(forward_loss, baseline_forward_loss);
    EXPECT_EQ(
        0, std::memcmp(d_logits.data(), baseline_d_logits.data(), d_logits.size() * sizeof(float)));
  }
}

TEST(CrossEntropy, ResultsDoNotDependOnRowAddress) {
  // Parity across ranks needs the same logits to give the same bits wherever they sit in memory (a
  // vectoriser that peeled iterations to align a row would change the summation order).
  const int64_t rows = 2, V = 1031;
  const auto logits = random_vector(rows * V, 13, 3.0f);
  const auto targets = make_targets(rows, V, 14);
  double baseline_loss = 0;
  std::vector<float> baseline_d_logits;
  for (int64_t shift = 0; shift < 16; ++shift) {
    SCOPED_TRACE(::testing::Message() << "shift=" << shift << " floats");
    std::vector<float> shifted(rows * V + shift);
    std::copy(logits.begin(), logits.end(), shifted.begin() + shift);
    const double loss = cross_entropy_forward_backward(
        shifted.data() + shift, shifted.data() + shift, targets.data(), rows, V, 1.0f);
    std::vector<float> d_logits(shifted.begin() + shift, shifted.end());
    if (shift == 0) {
      baseline_loss = loss;
      baseline_d_logits = d_logits;
      continue;
    }
    EXPECT_EQ(loss, baseline_loss);
    EXPECT_EQ(
        0, std::memcmp(d_logits.data(), baseline_d_logits.data(), d_logits.size() * sizeof(float)));
  }
}

TEST(CrossEntropy, RejectsTargetOutsideVocabulary) {
  const std::vector<float> logits(2 * 7, 0.0f);
  const std::vector<int32_t> targets = {3, 7};
  EXPECT_THROW(cross_entropy_forward(logits.data(), targets.data(), 2, 7), Error);
  std::vector<float> d_logits(2 * 7);
  EXPECT_THROW(
      cross_entropy_forward_backward(d_logits.data(), logits.data(), targets.data(), 2, 7, 1.0f),
      Error);
}

}  // namespace
}  // namespace lattice::kernels
