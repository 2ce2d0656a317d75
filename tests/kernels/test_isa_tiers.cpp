// Tests of the kernels' instruction-set tiers against each other: every tier this CPU can run
// (cpu_features) is called directly, beside the one the kernels choose, and must give the bits of
// the portable tier (the conversions, AdamW, the GELU's bf16 loops) or, for the sum of squares,
// whose AVX-512 tier adds in another order, the same sum to double rounding. On an AVX2-only host
// only the portable tier runs and the AVX-512 cases skip.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/cpu_features.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/activations_isa.hpp"
#include "lattice/kernels/cpu/adamw_isa.hpp"
#include "lattice/kernels/cpu/convert_isa.hpp"
#include "lattice/kernels/cpu/reduce_isa.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;

// Inputs with the cases a vector conversion can get wrong: ties, denormals, infinities, NaNs,
// the largest values, in a length with a tail past the last 16 lanes.
std::vector<float> awkward_floats() {
  std::vector<float> v = random_vector(1000, 3, 100.0f);
  const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x00000001u, 0x007fffffu, 0x00008000u,
                           0x80000001u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                           0x7f7fffffu, 0x7f7f8000u, 0x00000000u, 0x80000000u};
  for (size_t i = 0; i < std::size(bits); ++i) v[i * 37] = std::bit_cast<float>(bits[i]);
  v.resize(1000 - 7);
  return v;
}

TEST(IsaTiers, EveryConverterTierIsBitIdenticalToTheScalarRounding) {
  const CpuFeatures& cpu = cpu_features();
  const std::vector<float> in = awkward_floats();
  const auto n = static_cast<int64_t>(in.size());
  struct Case {
    const char* name;
    bool runs;
    const SerialConverters* converters;
  };
  const Case cases[] = {{"portable", true, &portable_converters()},
                        {"avx512", cpu.avx512(), cpu.avx512() ? &avx512::converters() : nullptr},
                        {"avx512bf16", cpu.avx512_with_bf16(),
                         cpu.avx512_with_bf16() ? &avx512bf16::converters() : nullptr}};
  for (const Case& c : cases) {
    if (!c.runs) continue;  // this CPU lacks the tier
    SCOPED_TRACE(c.name);
    std::vector<bf16> out(in.size()), scaled(in.size());
    c.converters->to_bf16(out.data(), in.data(), n);
    c.converters->to_bf16_scaled(scaled.data(), in.data(), n, 0.37f);
    std::vector<float> back(in.size());
    c.converters->to_f32(back.data(), out.data(), n);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i].bits, to_bf16(in[i]).bits) << "element " << i;
      ASSERT_EQ(scaled[i].bits, to_bf16(in[i] * 0.37f).bits) << "element " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(to_float(out[i])));
    }
  }
  // The chosen tier is the best one this CPU has.
  const SerialConverters* best = cpu.avx512_with_bf16() ? &avx512bf16::converters()
                                 : cpu.avx512()         ? &avx512::converters()
                                                        : &portable_converters();
  EXPECT_EQ(&serial_converters(), best);
}

TEST(IsaTiers, AdamWTiersAreBitIdentical) {
  if (!cpu_features().avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: only the portable tier";
  const int64_t n = 16 * 9 + 5;  // a masked tail
  const auto p0 = random_vector(n, 11), g = random_vector(n, 12), m0 = random_vector(n, 13, 0.1f);
  auto v0 = random_vector(n, 14, 0.01f);
  for (float& x : v0) x = std::fabs(x);
  const AdamWScalars s{0.7f, 0.9999f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f, -1e-3f};
  auto p_a = p0, m_a = m0, v_a = v0, p_b = p0, m_b = m0, v_b = v0;
  for (int step = 0; step < 3; ++step) {
    portable_adamw_range(p_a.data(), g.data(), m_a.data(), v_a.data(), n, s);
    avx512::adamw_range(p_b.data(), g.data(), m_b.data(), v_b.data(), n, s);
  }
  EXPECT_EQ(0, std::memcmp(p_a.data(), p_b.data(), sizeof(float) * p_a.size()));
  EXPECT_EQ(0, std::memcmp(m_a.data(), m_b.data(), sizeof(float) * m_a.size()));
  EXPECT_EQ(0, std::memcmp(v_a.data(), v_b.data(), sizeof(float) * v_a.size()));
}

TEST(IsaTiers, SumOfSquaresTiersAgreeToDoubleRounding) {
  if (!cpu_features().avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: only the portable tier";
  const auto x = random_vector(16384 - 3, 15, 3.0f);
  const auto n = static_cast<int64_t>(x.size());
  const double portable = portable_chunk_sum_of_squares(x.data(), n);
  const double vector = avx512::chunk_sum_of_squares(x.data(), n);
  EXPECT_NEAR(vector, portable, 1e-12 * portable);
  EXPECT_EQ(vector, avx512::chunk_sum_of_squares(x.data(), n));  // deterministic
}

TEST(IsaTiers, GeluVectorTiersGiveTheRoundedFp32GeluAndSlope) {
  const CpuFeatures& cpu = cpu_features();
  if (!cpu.avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: only the portable tier";
  const int64_t n = 16 * 20 + 9;
  const auto x = random_vector(n, 16, 4.0f);
  std::vector<float> value(static_cast<size_t>(n)), slope(static_cast<size_t>(n));
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  gelu_forward(value.data(), x.data(), n);
  gelu_backward(slope.data(), ones.data(), x.data(), n);
  const ActivationVectors* tiers[] = {
      &avx512::activation_vectors(),
      cpu.avx512_with_bf16() ? &avx512bf16::activation_vectors() : nullptr};
  for (const ActivationVectors* tier : tiers) {
    if (tier == nullptr) continue;
    std::vector<bf16> out(static_cast<size_t>(n)), out_slope(static_cast<size_t>(n));
    const int64_t done =
        tier->gelu_forward_bf16_with_slope(out.data(), out_slope.data(), x.data(), n);
    ASSERT_EQ(done, n / 16 * 16);
    for (int64_t i = 0; i < done; ++i) {
      ASSERT_EQ(out[i].bits, to_bf16(value[i]).bits) << i;
      ASSERT_EQ(out_slope[i].bits, to_bf16(slope[i]).bits) << i;
    }
    // The backward row: d_in16 = to_bf16(d_out * slope), the column sums in double.
    const auto d_out = random_vector(n, 17);
    std::vector<bf16> d_in16(static_cast<size_t>(n));
    std::vector<double> sums(static_cast<size_t>(n), 0.25);
    const int64_t row = tier->gelu_backward_from_slope_bf16_row(d_in16.data(), sums.data(),
                                                                d_out.data(), out_slope.data(), n);
    ASSERT_EQ(row, n / 16 * 16);
    for (int64_t j = 0; j < row; ++j) {
      const float product = d_out[j] * to_float(out_slope[j]);
      ASSERT_EQ(d_in16[j].bits, to_bf16(product).bits) << j;
      ASSERT_EQ(sums[j], 0.25 + static_cast<double>(product)) << j;
    }
  }
}

}  // namespace
}  // namespace lattice::kernels
