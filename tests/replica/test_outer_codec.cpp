// Tests of Streaming DiLoCo's low-precision exchange (parallel/replica/outer_codec.hpp) against an
// independent transcription: bf16 round-to-nearest-even from the bits, and FP4 E2M1 by searching
// the 15 representable values times the block's power-of-two scale for the nearest one; sizes,
// zeros, ragged last blocks and the refusal of a non-finite value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/parallel/replica/outer_codec.hpp"

using namespace lattice;
using namespace lattice::replica;

namespace {

std::vector<float> decoded(OuterPrecision p, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(
      static_cast<size_t>(encoded_bytes(p, static_cast<int64_t>(values.size()))));
  encode(p, values.data(), static_cast<int64_t>(values.size()), bytes.data());
  std::vector<float> out(values.size(), 0.0f);
  decode_add(p, bytes.data(), static_cast<int64_t>(values.size()), out.data());
  return out;
}

}  // namespace

TEST(OuterCodec, SizesAreFourTwoAndAQuarterPlusAScaleBytePerValue) {
  EXPECT_EQ(encoded_bytes(OuterPrecision::fp32, 100), 400);
  EXPECT_EQ(encoded_bytes(OuterPrecision::bf16, 100), 200);
  EXPECT_EQ(encoded_bytes(OuterPrecision::fp4, 64), 34);  // 2 blocks of 1 + 16 bytes
  EXPECT_EQ(encoded_bytes(OuterPrecision::fp4, 65), 51);  // a third, ragged block
  EXPECT_EQ(parse_outer_precision("fp4"), OuterPrecision::fp4);
  try {
    parse_outer_precision("int8");
    FAIL() << "int8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("diloco.exchange must be fp32, bf16 or fp4"),
              std::string::npos);
  }
}

TEST(OuterCodec, Bf16RoundsToNearestEven) {
  Rng rng(5);
  std::vector<float> values(1000);
  for (float& v : values) v = static_cast<float>(rng.normal()) * 1e-3f;
  values[0] = 1.0f + 0x1.0p-8f;  // exactly halfway between two bf16 values: to the even one, 1
  values[1] = 1.0f + 0x1.8p-7f;  // halfway, the upper one even: 1 + 2^-6
  const std::vector<float> out = decoded(OuterPrecision::bf16, values);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 0x1.0p-6f);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    const uint32_t lower = bits & 0xffff0000u, upper = lower + 0x10000u;
    float lo, hi;
    std::memcpy(&lo, &lower, 4);
    std::memcpy(&hi, &upper, 4);
    const float d_lo = std::fabs(values[i] - lo), d_hi = std::fabs(hi - values[i]);
    const float nearest = d_lo < d_hi ? lo : d_hi < d_lo ? hi : ((lower >> 16) & 1 ? hi : lo);
    ASSERT_EQ(out[i], nearest) << i;
  }
}

TEST(OuterCodec, Fp4IsTheNearestE2M1ValueOnABlockScaleThatClipsNothing) {
  Rng rng(7);
  const int64_t n = 32 * 40 + 7;  // a ragged last block
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = static_cast<float>(rng.normal()) * 1e-2f;
  for (int64_t i = 64; i < 96; ++i) values[i] = 0.0f;  // a zero block
  values[200] = 6.0f * 0x1.0p-9f;                      // a block whose maximum is on the grid
  const std::vector<float> out = decoded(OuterPrecision::fp4, values);
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int64_t begin = 0; begin < n; begin += 32) {
    const int64_t end = std::min(n, begin + 32);
    float amax = 0;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
    // The scale: the smallest power of two 2^e with amax <= 6·2^e.
    double scale = 0;
    if (amax > 0) {
      int e = -140;
      while (6.0 * std::ldexp(1.0, e) < amax) ++e;
      scale = std::ldexp(1.0, e);
    }
    for (int64_t i = begin; i < end; ++i) {
      double best = 0, best_distance = 1e30;
      for (float g : grid)
        for (double sign : {1.0, -1.0}) {
          const double candidate = sign * g * scale;
          const double distance = std::fabs(candidate - values[i]);
          if (distance < best_distance - 1e-30) {
            best = candidate;
            best_distance = distance;
          }
        }
      // A tie between two grid points may go either way: the distance is what must match.
      ASSERT_NEAR(std::fabs(out[i] - values[i]), best_distance, 1e-12) << i;
      ASSERT_LE(std::fabs(out[i]), 6.0 * scale) << i;  // nothing beyond the grid
      (void)best;
    }
  }
  EXPECT_EQ(out[200], values[200]);  // on the grid: exact
  for (int64_t i = 64; i < 96; ++i) EXPECT_EQ(out[i], 0.0f);
  // decode_add adds: decoding twice gives twice the values.
  std::vector<uint8_t> bytes(static_cast<size_t>(encoded_bytes(OuterPrecision::fp4, n)));
  encode(OuterPrecision::fp4, values.data(), n, bytes.data());
  std::vector<float> twice(static_cast<size_t>(n), 0.0f);
  decode_add(OuterPrecision::fp4, bytes.data(), n, twice.data());
  decode_add(OuterPrecision::fp4, bytes.data(), n, twice.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(twice[i], 2 * out[i]);
}

TEST(OuterCodec, RefusesANonFiniteOuterGradient) {
  std::vector<float> values(40, 1e-3f);
  values[33] = std::nanf("");
  std::vector<uint8_t> bytes(static_cast<size_t>(encoded_bytes(OuterPrecision::fp4, 40)));
  try {
    encode(OuterPrecision::fp4, values.data(), 40, bytes.data());
    FAIL() << "NaN encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos);
  }
}
