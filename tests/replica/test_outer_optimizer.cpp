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
