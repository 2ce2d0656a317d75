// Tests of the packed AMX row-chunk GEMM: both packings of a Linear's weight against a double
// reference on the same bf16 values, row tails (M not a multiple of 32), strided A and C, K longer
// than one K block, bit-equality with oneDNN's GEMM where both sweep K in order, bad shapes, and
// the tile configuration AmxTileScope loads (read back from the CPU). Skipped where the CPU or
// kernel grants no AMX tile state (the kernel is then never used).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/matmul.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;
using lattice::testing::rounded_to_bf16;

struct Case {
  int64_t M, K, N;
};

// C = A · B on bf16 operands through the kernel, B = weight^T (weight [N, K]) or B = weight
// ([K, N]), A with row stride lda = Kp + a_pad (zeros in columns [K, Kp)) and C with row stride
// ldc = Np + c_pad, Kp and Np being K and N rounded up to 32: C's columns [N, Np) must come out
// zero and its padding past Np stay untouched.
void expect_matches_reference(const Case& c, bool weight_transposed, int64_t a_pad, int64_t c_pad,
                              uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N
                                    << (weight_transposed ? " B=W^T" : " B=W") << " lda pad "
                                    << a_pad << " ldc pad " << c_pad);
  const int64_t Kp = amx_padded(c.K), Np = amx_padded(c.N);
  const int64_t lda = Kp + a_pad, ldc = Np + c_pad;
  auto a = rounded_to_bf16(random_vector(c.M * lda, seed, 1.0f));
  for (int64_t m = 0; m < c.M; ++m)
    std::fill(a.begin() + m * lda + c.K, a.begin() + m * lda + Kp, lattice::bf16{0});
  const auto weight = rounded_to_bf16(random_vector(c.K * c.N, seed + 1, 1.0f));
  std::vector<uint16_t> packed(static_cast<size_t>(Kp * Np), 0xffff);
  pack_b_panels(packed.data(), weight.data(), weight_transposed, c.K, c.N);
  const float sentinel = -12345.0f;
  std::vector<float> out(static_cast<size_t>(c.M * ldc), sentinel);
  amx_packed_gemm(out.data(), ldc, a.data(), lda, packed.data(), c.M, c.N, c.K);
  // fp32 accumulation of exact bf16 products: each element within K · 2^-24 of the sum of |terms|
  // (recursive summation), far below any indexing or packing mistake (errors of order one term).
  int64_t bad = 0;
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double b =
            lattice::to_float(weight_transposed ? weight[n * c.K + k] : weight[k * c.N + n]);
        const double term = lattice::to_float(a[m * lda + k]) * b;
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(c.K) * std::ldexp(1.0, -24) * magnitude + 1e-30;
      bad += std::fabs(out[m * ldc + n] - exact) > bound;
    }
    for (int64_t n = c.N; n < Np; ++n) bad += out[m * ldc + n] != 0.0f;
    for (int64_t n = Np; n < ldc; ++n) bad += out[m * ldc + n] != sentinel;
  }
  EXPECT_EQ(bad, 0);
}

TEST(AmxPackedGemm, BothPackingsMatchTheReferenceAcrossShapes) {
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX tile state on this machine";
  // M below, at, between and above 32-row blocks; K of one step, several steps, and longer than
  // one 1024-wide K block (1056, 2048); N of one and several 32-column panels.
  const Case cases[] = {{1, 32, 32},     {31, 64, 96},   {32, 256, 64},   {33, 96, 128},
                        {100, 1056, 64}, {64, 2048, 32}, {256, 256, 1024}};
  uint64_t seed = 10;
  for (const Case& c : cases)
    for (bool transposed : {true, false}) expect_matches_reference(c, transposed, 0, 0, seed += 2);
}

TEST(AmxPackedGemm, PadsKAndNThatAreNotMultiplesOf32) {
  // GPT-2's vocabulary (50,257) as N in the head's forward and as K in its input gradient.
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX tile state on this machine";
  const Case cases[] = {{5, 50, 70}, {40, 64, 33}, {33, 77, 64}, {64, 1, 1}, {70, 1100, 45}};
  uint64_t seed = 60;
  for (const Case& c : cases)
    for (bool transposed : {true, false}) expect_matches_reference(c, transposed, 0, 3, seed += 2);
}

TEST(AmxPackedGemm, StridedRowsLeaveThePaddingAlone) {
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX tile state on this machine";
  expect_matches_reference({45, 64, 96}, true, 32, 16, 40);
  expect_matches_reference({70, 128, 64}, false, 64, 5, 42);
}

TEST(AmxPackedGemm, EqualsOneDnnBitForBitWhereBothSweepKInOrder) {
  // Each element is a chain of tdpbf16ps over K in steps of 32, as oneDNN's brgemm computes the
  // Linear shapes of the benchmark models (K up to 1024: its whole product, forward and input
  // gradient); the row-chunk paths rely on it to match MatmulEngine::forward / backward.
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX tile state on this machine";
#if defined(LATTICE_AMX_EMULATED)
  GTEST_SKIP() << "emulated tiles: oneDNN's bf16 GEMM here runs without AMX, in another order";
#endif
  MatmulEngine engine;
  for (const Case& c : {Case{256, 256, 1024}, Case{256, 1024, 256}, Case{96, 768, 768}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N);
    const auto in = random_vector(c.M * c.K, 50, 1.0f);
    const auto weight = random_vector(c.N * c.K, 51, 0.5f);  // a Linear's [N out, K in]
    const auto in16 = rounded_to_bf16(in), weight16 = rounded_to_bf16(weight);
    // oneDNN through the engine's general GEMM (its Linear forward runs these shapes on this
    // kernel now): out = in · weight^T, both rounded to bf16 by the engine.
    std::vector<float> expected(static_cast<size_t>(c.M * c.N));
    engine.gemm(false, true, c.M, c.N, c.K, 1.0f, in.data(), c.K, weight.data(), c.K, 0.0f,
                expected.data(), c.N, Precision::bf16);
    std::vector<uint16_t> packed(weight16.size());
    pack_b_panels(packed.data(), weight16.data(), /*weight_transposed=*/true, c.K, c.N);
    std::vector<float> got(expected.size());
    amx_packed_gemm(got.data(), c.N, in16.data(), c.K, packed.data(), c.M, c.N, c.K);
    EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), sizeof(float) * got.size()));
  }
}

TEST(AmxPackedGemm, RejectsShapesItCannotTake) {
  EXPECT_TRUE(amx_packed_gemm_fits(32, 64));
  EXPECT_FALSE(amx_packed_gemm_fits(48, 64));
  EXPECT_FALSE(amx_packed_gemm_fits(64, 50257));
  EXPECT_FALSE(amx_packed_gemm_fits(0, 32));
  EXPECT_EQ(amx_padded(50257), 50272);
  EXPECT_EQ(amx_padded(64), 64);
  std::vector<uint16_t> packed(64 * 64);
  std::vector<lattice::bf16> weight(64 * 64);
  EXPECT_THROW(pack_b_panels(packed.data(), weight.data(), true, 0, 64), Error);
  // The GEMM checks its strides inside its AMX translation unit (compiled for AMX and AVX-512): on
  // a host without them it cannot be entered at all.
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX tile state on this machine";
  std::vector<float> out(64 * 64);
  // Row strides must reach K and N rounded up to 32.
  EXPECT_THROW(amx_packed_gemm(out.data(), 64, weight.data(), 48, packed.data(), 1, 64, 48), Error);
  EXPECT_THROW(amx_packed_gemm(out.data(), 40, weight.data(), 64, packed.data(), 1, 40, 64), Error);
}

// The configuration the CPU holds inside an AmxTileScope, read back with sttilecfg: palette 1 and
// eight tiles of 16 rows by 64 bytes. (GCC 12's _tile_loadconfig gives the compiler an 8-byte
// operand, and a build once dropped the column-width stores: ldtilecfg then faulted.)
TEST(AmxTileScope, LoadsEightTilesOf16RowsBy64Bytes) {
#if defined(LATTICE_HAS_AMX) && !defined(LATTICE_AMX_EMULATED)
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } held{};
  {
    const AmxTileScope tiles;
    asm volatile("sttilecfg %0" : "=m"(held));
  }
  EXPECT_EQ(held.palette, 1);
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(held.colsb[t], t < 8 ? 64 : 0) << "tile " << t;
    EXPECT_EQ(held.rows[t], t < 8 ? 16 : 0) << "tile " << t;
  }
#else
  GTEST_SKIP() << "this test file is not compiled for AMX (or runs on the emulation)";
#endif
}

}  // namespace
}  // namespace lattice::kernels
