// Tests for fast_exp: accuracy against double-precision exp over its whole working range (evaluated
// in a vectorised loop, as the kernels use it) and its documented behaviour outside that range; the
// 16-lane AVX-512 form bit for bit against the scalar one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lattice/kernels/cpu/fast_exp.hpp"

namespace lattice::kernels {
namespace {

TEST(FastExp, WithinAboutOneUlpOverWorkingRange) {
  // Dense sweep of [-87, 88] (2M points, every spacing of the argument reduction is hit many
  // times).
  const int64_t points = 2000000;
  std::vector<float> x(points), y(points);
  for (int64_t i = 0; i < points; ++i) {
    x[i] = -87.0f + 175.0f * static_cast<float>(i) / static_cast<float>(points - 1);
  }
#pragma omp simd
  for (int64_t i = 0; i < points; ++i) y[i] = fast_exp(x[i]);
  double worst = 0;
  for (int64_t i = 0; i < points; ++i) {
    const double exact = std::exp(static_cast<double>(x[i]));
    worst = std::fmax(worst, std::fabs(y[i] - exact) / exact);
  }
  // The header promises relative error below 1.5e-7 (fp32's ulp is 1.2e-7 at 1; measured 8.3e-8).
  EXPECT_LT(worst, 1.5e-7);
}

TEST(FastExp, ExactAtZeroAndSaturatesOutsideRange) {
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_EQ(fast_exp(-87.5f), 0.0f);
  EXPECT_EQ(fast_exp(-1e30f), 0.0f);
  EXPECT_EQ(fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  const float highest = fast_exp(88.0f);
  EXPECT_TRUE(std::isfinite(highest));
  EXPECT_NEAR(highest, std::exp(88.0), 1.5e-7 * std::exp(88.0));
  EXPECT_EQ(fast_exp(1e30f), highest);
  EXPECT_EQ(fast_exp(std::numeric_limits<float>::infinity()), highest);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

#if defined(__AVX512F__)
TEST(FastExp, SixteenLanesEqualTheScalarBitForBit) {
  // A sweep past both ends of the range, then the edges and special values.
  std::vector<float> x;
  for (int64_t i = 0; i < 400000; ++i) x.push_back(-100.0f + 200.0f * static_cast<float>(i) / 4e5f);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {-87.0f, std::nextafter(-87.0f, -inf), std::nextafter(-87.0f, inf), 88.0f,
                  std::nextafter(88.0f, inf), 0.0f, -0.0f, 1e-39f, -1e-39f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), 1e30f, -1e30f})
    x.push_back(v);
  while (x.size() % 16 != 0) x.push_back(1.0f);
  for (size_t i = 0; i < x.size(); i += 16) {
    float lanes[16];
    _mm512_storeu_ps(lanes, fast_exp(_mm512_loadu_ps(x.data() + i)));
    for (size_t j = 0; j < 16; ++j) {
      const float scalar = fast_exp(x[i + j]);
      ASSERT_EQ(0, std::memcmp(&lanes[j], &scalar, 4)) << "x = " << x[i + j];
    }
  }
}
#endif

}  // namespace
}  // namespace lattice::kernels
