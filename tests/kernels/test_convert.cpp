// Tests of the bulk fp32 <-> bf16 conversions: bit-identical to lattice::to_bf16 / to_float on edge
// cases (ties, denormals, overflow, infinities, NaNs), on sweeps of bit patterns and across
// threads.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

std::vector<float> from_bits(const std::vector<uint32_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = std::bit_cast<float>(bits[i]);
  return v;
}

// Counts positions where the bulk conversion's bits differ from the scalar reference's.
int64_t mismatches_against_to_bf16(const std::vector<float>& in) {
  std::vector<bf16> out(in.size());
  convert_to_bf16(out.data(), in.data(), static_cast<int64_t>(in.size()));
  int64_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i) wrong += out[i].bits != to_bf16(in[i]).bits;
  return wrong;
}

TEST(Convert, EdgeCasesMatchScalarRounding) {
  const std::vector<uint32_t> edge = {
      0x00000000, 0x80000000,              // +-0
      0x3f800000, 0xbf800000,              // +-1
      0x3f808000, 0x3f818000, 0x3f808001,  // ties to even (down, up) and just above a tie
      0x3f807fff, 0x3f80ffff,  // just below a tie; rounds up to the next exponent's 1.0x
      0x00000001, 0x007fffff, 0x00008000,  // denormals: smallest, largest, exact tie
      0x00018000, 0x80000001, 0x807fffff,  // denormal tie rounding up, negative denormals
      0x7f7fffff, 0xff7fffff, 0x7f7f8000,  // largest finite: rounds to infinity; tie to infinity
      0x7f7f7fff,                          // just below: stays finite
      0x7f800000, 0xff800000,              // +-inf
      0x7fc00000, 0xffc00000, 0x7f800001,  // quiet NaNs, signalling NaN with low payload only
      0x7fa00000, 0xff800001, 0x7fffffff,  // signalling NaN, negative NaN, all-ones NaN
  };
  // Repeat so the values land both in full 16-wide vectors and in the scalar tail.
  std::vector<uint32_t> bits;
  for (int r = 0; r < 3; ++r) bits.insert(bits.end(), edge.begin(), edge.end());
  auto in = from_bits(bits);
  std::vector<bf16> out(in.size());
  convert_to_bf16(out.data(), in.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(out[i].bits, to_bf16(in[i]).bits) << std::hex << "input bits 0x" << bits[i];
  // A few values spelled out, so the reference itself is pinned too.
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00008000u)).bits, 0x0000);  // denormal tie to even zero
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00018000u)).bits, 0x0002);  // denormal kept, not flushed
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7f7fffffu)).bits, 0x7f80);  // overflow to infinity
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7f800001u)).bits, 0x7fc0);  // NaN stays NaN, quiet
}

// The AVX512_BF16 path converts whole vectors with vcvtneps2bf16, which flushes denormal inputs,
// and redoes a vector in integer arithmetic when it holds one: put a single denormal (or NaN,
// infinity, zero) at every lane of otherwise normal vectors.
TEST(Convert, OneSpecialValueInANormalVectorMatchesScalarRounding) {
  const std::vector<uint32_t> specials = {0x00000001, 0x807fffff, 0x00018000, 0x00000000,
                                          0x80000000, 0x7f800001, 0xffc00000, 0x7f800000};
  for (uint32_t special : specials) {
    for (int lane = 0; lane < 16; ++lane) {
      std::vector<float> in(32);
      for (size_t i = 0; i < in.size(); ++i) in[i] = 1.0f + 0.37f * static_cast<float>(i);
      in[static_cast<size_t>(lane)] = std::bit_cast<float>(special);
      in[static_cast<size_t>(16 + lane)] = std::bit_cast<float>(special);
      EXPECT_EQ(mismatches_against_to_bf16(in), 0)
          << std::hex << "special 0x" << special << std::dec << " at lane " << lane;
    }
  }
}

TEST(Convert, SweepOfBitPatternsMatchesScalarRounding) {
  // Every upper half-word combined with the lower halves that matter for rounding (zero, odd, below
  // the tie, the tie, above the tie, all ones) and one random lower half: covers every exponent,
  // sign, NaN payload class and rounding case.
  Rng rng(7);
  std::vector<uint32_t> bits;
  for (uint32_t upper = 0; upper < 0x10000u; ++upper)
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                           static_cast<uint32_t>(rng.next_u64() & 0xffffu)})
      bits.push_back((upper << 16) | lower);
  EXPECT_EQ(mismatches_against_to_bf16(from_bits(bits)), 0);
}

// The scaled form rounds the fp32 product in[i] * scale exactly as to_bf16 does, on the same
// sweep (products reach denormals, infinities and NaNs) and with a 16-lane tail.
TEST(Convert, ScaledConversionRoundsTheFp32Product) {
  std::vector<float> in;
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 0x10001ull * 7)
    in.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  in.resize(in.size() / 16 * 16 + 5);
  for (float scale : {1.0f, 0.37f, -3.0e-6f, 1.0e30f, 0.0f}) {
    std::vector<bf16> out(in.size());
    convert_scaled_to_bf16_on_this_thread(out.data(), in.data(), scale,
                                          static_cast<int64_t>(in.size()));
    int64_t wrong = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const volatile float product = in[i] * scale;  // rounded to fp32, as the kernel does
      wrong += out[i].bits != to_bf16(product).bits;
    }
    EXPECT_EQ(wrong, 0) << "scale " << scale;
  }
}

TEST(Convert, RandomValuesMatchAcrossThreadCounts) {
  // More than one parallel chunk and not a multiple of the vector width.
  const int64_t n = 3 * (1 << 16) + 13;
  Rng rng(8);
  std::vector<float> in(static_cast<size_t>(n));
  for (auto& x : in) x = rng.normal() * 100.0f;
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    EXPECT_EQ(mismatches_against_to_bf16(in), 0) << threads << " threads";
  }
}

TEST(Convert, Bf16ToFloatIsExactForAllPatterns) {
  std::vector<bf16> in(0x10000 + 5);
  for (size_t i = 0; i < in.size(); ++i) in[i].bits = static_cast<uint16_t>(i);
  std::vector<float> out(in.size());
  convert_to_f32(out.data(), in.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), static_cast<uint32_t>(in[i].bits) << 16) << i;
}

TEST(Convert, StridedRowsArePackedDensely) {
  const int64_t rows = 37, cols = 21, stride = 29;
  Rng rng(9);
  std::vector<float> in(static_cast<size_t>(rows * stride));
  for (auto& x : in) x = rng.normal();
  std::vector<bf16> out(static_cast<size_t>(rows * cols));
  convert_rows_to_bf16(out.data(), in.data(), rows, cols, stride);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(out[r * cols + c].bits, to_bf16(in[r * stride + c]).bits) << r << "," << c;
}

TEST(Convert, EmptyInputIsANoOp) {
  convert_to_bf16(nullptr, nullptr, 0);
  convert_to_f32(nullptr, nullptr, 0);
  convert_rows_to_bf16(nullptr, nullptr, 0, 5, 5);
}

}  // namespace
}  // namespace lattice::kernels
