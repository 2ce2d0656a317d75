// Tests of DiLoCo's outer step against a double-precision transcription of torch.optim.SGD's
// documented update (momentum buffer b ← μ·b + g, Nesterov g + μ·b, p ← p − lr·step) applied to the
// anchor with the pseudo-gradient g = anchor − θ̄; and the identity of lr 1 without momentum.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/parallel/replica/outer_optimizer.hpp"

using namespace lattice;
using namespace lattice::replica;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

}  // namespace

TEST(OuterOptimizer, FollowsTorchSgdOnThePseudoGradient) {
  const int64_t n = 4099;
  for (bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "heavy ball");
    const OuterSettings settings{0.7f, 0.9f, nesterov};
    const std::vector<float> start = random_values(n, 1, 1.0f);
    OuterOptimizer outer(start.data(), n, settings);
    std::vector<double> p(start.begin(), start.end()), buffer(static_cast<size_t>(n), 0.0);
    for (int round = 0; round < 5; ++round) {
      // The groups' mean after H inner steps: the anchor moved by a small random drift.
      std::vector<float> mean(static_cast<size_t>(n));
      const std::vector<float> drift = random_values(n, 10 + round, 1e-2f);
      for (int64_t i = 0; i < n; ++i)
        mean[static_cast<size_t>(i)] = outer.anchor()[static_cast<size_t>(i)] + drift[i];
      std::vector<double> g(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) g[i] = p[i] - static_cast<double>(mean[i]);
      outer.step(mean.data());
      double max_error = 0, max_step = 0;
      for (int64_t i = 0; i < n; ++i) {
        buffer[i] = 0.9 * buffer[i] + g[i];
        const double d = nesterov ? g[i] + 0.9 * buffer[i] : buffer[i];
        const double next = p[i] - 0.7 * d;
        max_step = std::max(max_step, std::fabs(next - p[i]));
        p[i] = next;
        max_error = std::max(max_error, std::fabs(mean[i] - next));
        ASSERT_EQ(mean[i], outer.anchor()[i]);  // the result is the next anchor
      }
      // fp32 rounding of values of magnitude ~1 (2^-24 each, a few operations) against steps of
      // ~1e-2: a wrong sign, factor or missing momentum is off by the step itself.
      EXPECT_LT(max_error, 1e-6) << "round " << round;
      EXPECT_GT(max_step, 1e-2) << "round " << round;
    }
    EXPECT_EQ(outer.steps_taken(), 5);
  }
}

TEST(OuterOptimizer, LearningRateOneWithoutMomentumIsTheMeanBitForBit) {
  const int64_t n = 10'000;
  const std::vector<float> start = random_values(n, 2, 3.0f);
  OuterOptimizer outer(start.data(), n, {1.0f, 0.0f, true});
  for (int round = 0; round < 3; ++round) {
    // Means of every scale against the anchor, tiny values and sign changes included.
    std::vector<float> mean = random_values(n, 20 + round, round == 0 ? 1e-30f : 5.0f);
    const std::vector<float> expected = mean;
    outer.step(mean.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(mean[i], expected[i]) << i;
  }
}

TEST(OuterOptimizer, RefusesImpossibleSettingsInOneLine) {
  EXPECT_THROW(validate(OuterSettings{0.0f, 0.9f, true}), Error);
  EXPECT_THROW(validate(OuterSettings{0.7f, 1.0f, true}), Error);
  EXPECT_THROW(validate(OuterSettings{0.7f, -0.1f, true}), Error);
  EXPECT_THROW(validate(OuterSettings{NAN, 0.9f, true}), Error);
  try {
    validate(OuterSettings{0.7f, 1.5f, true});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("diloco.outer_momentum"), std::string::npos);
  }
}

// Streaming DiLoCo's fragment step: on the elements in the ranges it equals the whole-store step
// bit for bit (the same arithmetic), outside them the anchor and the momentum stay as they were;
// from the mean Δ (an encoded exchange) it takes θ ← anchor − lr·d, within fp32 rounding of the
// θ̄ form (which computes the same value another way).
TEST(OuterOptimizer, StepsOnlyTheFragmentAndFromTheMeanDelta) {
  const int64_t n = 1000;
  const OuterSettings settings{0.7f, 0.9f, true};
  const std::vector<float> start = random_values(n, 3, 1.0f);
  OuterOptimizer whole(start.data(), n, settings), part(start.data(), n, settings),
      from_delta(start.data(), n, settings);
  const std::vector<ElementRange> ranges = {{10, 200}, {500, 520}, {900, 1000}};
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> drift = random_values(n, 20 + round, 1e-2f);
    std::vector<float> mean(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mean[i] = whole.anchor()[i] + drift[i];
    std::vector<float> packed, delta;
    for (const ElementRange& r : ranges)
      for (int64_t i = r.begin; i < r.end; ++i) {
        packed.push_back(mean[i]);
        delta.push_back(from_delta.anchor()[i] - mean[i]);
      }
    const std::vector<float> anchor_before = part.anchor(), momentum_before = part.momentum();
    whole.step(mean.data());
    part.step(packed.data(), ranges);
    from_delta.step_delta(delta.data(), ranges);
    size_t k = 0;
    std::vector<bool> inside(static_cast<size_t>(n), false);
    for (const ElementRange& r : ranges)
      for (int64_t i = r.begin; i < r.end; ++i, ++k) {
        inside[i] = true;
        ASSERT_EQ(packed[k], mean[i]) << i;  // the whole step's θ, bit for bit
        ASSERT_EQ(part.anchor()[i], packed[k]);
        ASSERT_EQ(part.momentum()[i], whole.momentum()[i]);
        // Δ itself instead of anchor − θ̄: one rounding of the subtraction apart.
        EXPECT_NEAR(delta[k], packed[k], 1e-6f) << i;
      }
    for (int64_t i = 0; i < n; ++i)
      if (!inside[i]) {
        ASSERT_EQ(part.anchor()[i], anchor_before[i]) << i;
        ASSERT_EQ(part.momentum()[i], momentum_before[i]) << i;
      }
    // The whole optimizer moved everything; for the next round the parts start from its anchor
    // inside the ranges only, so re-anchor the others to keep comparing like with like.
    part.load(whole.anchor().data(), whole.momentum().data(), part.steps_taken());
    from_delta.load(whole.anchor().data(), whole.momentum().data(), from_delta.steps_taken());
  }
  EXPECT_EQ(part.steps_taken(), 3);
}
