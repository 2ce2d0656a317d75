// Tests of the AMX weight-gradient kernel: against a double reference on the same bf16 values in
// each of its three updates (token tails, several token blocks, one block of all tokens, rows not
// a multiple of 32, strided operands and output), zero tokens, `add` as an exact fp32 add of the
// fresh sum, the same bits for any split of dW between threads, bit-equality with oneDNN's GEMM
// where both sweep the tokens in order, MatmulEngine::backward using it, and bad shapes. Skipped
// where the CPU or kernel grants no AMX tile state.
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
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"
#include "lattice/kernels/cpu/matmul.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;
using lattice::testing::rounded_to_bf16;

std::vector<float> widened(const std::vector<lattice::bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = lattice::to_float(x[i]);
  return out;
}

struct Case {
  int64_t M, rows, columns;
};

// Operands of one case: D [M, ldd] and X [M, ldx] in bf16.
struct Operands {
  int64_t ldd, ldx;
  std::vector<lattice::bf16> D, X;
};

// D's rows hold `rows` rounded up to 32 (the kernel reads that far) plus d_pad.
Operands operands(const Case& c, int64_t d_pad, int64_t x_pad, uint64_t seed) {
  Operands o{(c.rows + 31) / 32 * 32 + d_pad, c.columns + x_pad, {}, {}};
  o.D = rounded_to_bf16(random_vector(c.M * o.ldd, seed, 1.0f));
  o.X = rounded_to_bf16(random_vector(c.M * o.ldx, seed + 1, 1.0f));
  return o;
}

// dW (+)= D^T · X through the kernel on this thread.
void run_block(std::vector<float>& dW, int64_t ldw, const Operands& o, const Case& c,
               WeightGradientUpdate update) {
  std::vector<char> scratch(amx_weight_gradient_scratch_bytes(c.M, c.rows, c.columns, update) + 64);
  void* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  amx_weight_gradient_block(dW.data(), ldw, o.D.data(), o.ldd, o.X.data(), o.ldx, c.M, c.rows,
                            c.columns, update, aligned);
}

const char* name(WeightGradientUpdate update) {
  switch (update) {
    case WeightGradientUpdate::overwrite:
      return "overwrite";
    case WeightGradientUpdate::add:
      return "add";
    case WeightGradientUpdate::accumulate:
      return "accumulate";
  }
  return "?";
}

void expect_matches_reference(const Case& c, WeightGradientUpdate update, int64_t pad,
                              uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "M=" << c.M << " rows=" << c.rows << " columns=" << c.columns
                                    << " " << name(update) << " pad " << pad);
  const Operands o = operands(c, pad, 2 * pad, seed);
  const int64_t ldw = c.columns + pad;
  const std::vector<float> before = random_vector(c.rows * ldw, seed + 2, 1.0f);
  std::vector<float> dW = before;
  run_block(dW, ldw, o, c, update);
  // fp32 accumulation of exact bf16 products: each element within (M + 1) · 2^-24 of the sum of
  // |terms| (recursive summation, and dW's value added first or last), far below any indexing,
  // packing or transposing mistake (errors of order one term).
  int64_t bad = 0;
  for (int64_t n = 0; n < c.rows; ++n) {
    for (int64_t k = 0; k < c.columns; ++k) {
      double exact = update == WeightGradientUpdate::overwrite ? 0.0 : before[n * ldw + k];
      double magnitude = std::fabs(exact);
      for (int64_t m = 0; m < c.M; ++m) {
        const double term = static_cast<double>(lattice::to_float(o.D[m * o.ldd + n])) *
                            lattice::to_float(o.X[m * o.ldx + k]);
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(c.M + 1) * std::ldexp(1.0, -24) * magnitude + 1e-30;
      bad += std::fabs(dW[n * ldw + k] - exact) > bound;
    }
    for (int64_t k = c.columns; k < ldw; ++k) bad += dW[n * ldw + k] != before[n * ldw + k];
  }
  EXPECT_EQ(bad, 0);
}

constexpr WeightGradientUpdate kUpdates[] = {
    WeightGradientUpdate::overwrite, WeightGradientUpdate::add, WeightGradientUpdate::accumulate};

TEST(AmxWeightGradient, MatchesTheReferenceAcrossShapes) {
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  // Tokens: one, below / at / above a 32-token step, one whole 256-token block, one more than a
  // block, and several blocks with a ragged end (one block of all of them where the sums wait in
  // dW and X's panels fit); rows and columns of one and several 32-blocks; rows not a multiple of
  // 32 (a vocabulary's), with one and several token blocks.
  const Case cases[] = {{1, 32, 32},     {31, 64, 96},  {32, 32, 64},   {33, 96, 32},
                        {256, 64, 64},   {257, 32, 96}, {600, 64, 128}, {1024, 128, 32},
                        {3000, 32, 256}, {70, 45, 64},  {700, 77, 96},  {300, 5, 32}};
  uint64_t seed = 100;
  for (const Case& c : cases)
    for (WeightGradientUpdate update : kUpdates) expect_matches_reference(c, update, 0, seed += 3);
}

TEST(AmxWeightGradient, StridedOperandsAndOutputLeaveThePaddingAlone) {
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  expect_matches_reference({45, 64, 96}, WeightGradientUpdate::overwrite, 16, 200);
  expect_matches_reference({300, 96, 64}, WeightGradientUpdate::add, 32, 210);
  expect_matches_reference({300, 50, 64}, WeightGradientUpdate::accumulate, 32, 220);
}

TEST(AmxWeightGradient, ZeroTokensGiveZerosOrLeaveDwUnchanged) {
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  const Case c{0, 32, 64};
  const Operands o = operands(c, 0, 0, 300);
  const std::vector<float> before = random_vector(c.rows * c.columns, 301, 1.0f);
  std::vector<float> dW = before;
  run_block(dW, c.columns, o, c, WeightGradientUpdate::add);
  EXPECT_EQ(dW, before);
  run_block(dW, c.columns, o, c, WeightGradientUpdate::accumulate);
  EXPECT_EQ(dW, before);
  run_block(dW, c.columns, o, c, WeightGradientUpdate::overwrite);
  EXPECT_EQ(dW, std::vector<float>(before.size(), 0.0f));
}

TEST(AmxWeightGradient, AddingAddsTheFreshSumInFp32) {
  // The order of oneDNN's GEMM with its sum post-op: the tokens' sum from zero, then one add.
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  for (const Case& c : {Case{100, 64, 64}, Case{700, 32, 96}}) {
    const Operands o = operands(c, 0, 0, 400);
    const std::vector<float> before = random_vector(c.rows * c.columns, 401, 1.0f);
    std::vector<float> fresh(before.size()), accumulated = before;
    run_block(fresh, c.columns, o, c, WeightGradientUpdate::overwrite);
    run_block(accumulated, c.columns, o, c, WeightGradientUpdate::add);
    for (size_t i = 0; i < before.size(); ++i) {
      const float expected = before[i] + fresh[i];
      ASSERT_EQ(0, std::memcmp(&accumulated[i], &expected, sizeof(float))) << "element " << i;
    }
  }
}

TEST(AmxWeightGradient, AnySplitOfDwGivesTheSameBits) {
  // MatmulEngine splits dW's rows or columns between threads: each element's sum must not depend
  // on which block it was computed in.
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  const Case whole{520, 128, 96};
  const Operands o = operands(whole, 0, 0, 500);
  std::vector<float> expected(static_cast<size_t>(whole.rows * whole.columns));
  run_block(expected, whole.columns, o, whole, WeightGradientUpdate::add);  // onto zeros
  std::vector<char> scratch(amx_weight_gradient_scratch_bytes(whole.M, whole.rows, whole.columns,
                                                              WeightGradientUpdate::add) +
                            64);
  void* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  std::vector<float> by_rows(expected.size()), by_columns(expected.size());
  for (int64_t r0 : {0, 32})  // rows [0, 32) and [32, 128)
    amx_weight_gradient_block(by_rows.data() + r0 * whole.columns, whole.columns, o.D.data() + r0,
                              o.ldd, o.X.data(), o.ldx, whole.M, r0 == 0 ? 32 : 96, whole.columns,
                              WeightGradientUpdate::add, aligned);
  for (int64_t k0 : {0, 64})  // columns [0, 64) and [64, 96)
    amx_weight_gradient_block(by_columns.data() + k0, whole.columns, o.D.data(), o.ldd,
                              o.X.data() + k0, o.ldx, whole.M, whole.rows, k0 == 0 ? 64 : 32,
                              WeightGradientUpdate::add, aligned);
  EXPECT_EQ(0, std::memcmp(by_rows.data(), expected.data(), sizeof(float) * expected.size()));
  EXPECT_EQ(0, std::memcmp(by_columns.data(), expected.data(), sizeof(float) * expected.size()));
}

TEST(AmxWeightGradient, EqualsOneDnnBitForBitWhereItSweepsTheTokensInOrder) {
  // oneDNN's brgemm sums a reduction of up to 256 tokens (the LM head's row chunks) as one chain
  // of tdpbf16ps in order, as the kernel does (longer ones it splits differently: there the two
  // agree to fp32 rounding, as the reference test above bounds).
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
#if defined(LATTICE_AMX_EMULATED)
  GTEST_SKIP() << "emulated tiles: oneDNN's bf16 GEMM here runs without AMX, in another order";
#endif
  MatmulEngine engine;
  for (const Case& c : {Case{256, 1024, 256}, Case{128, 256, 64}, Case{64, 96, 256}}) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << c.M << " rows=" << c.rows << " columns=" << c.columns);
    const Operands o = operands(c, 0, 0, 600);
    const std::vector<float> d = widened(o.D), x = widened(o.X);  // exactly bf16 values
    std::vector<float> expected(static_cast<size_t>(c.rows * c.columns));
    engine.gemm(/*transpose_a=*/true, /*transpose_b=*/false, c.rows, c.columns, c.M, 1.0f, d.data(),
                c.rows, x.data(), c.columns, 0.0f, expected.data(), c.columns, Precision::bf16);
    std::vector<float> got(expected.size());
    run_block(got, c.columns, o, c, WeightGradientUpdate::overwrite);
    EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), sizeof(float) * got.size()));
  }
}

TEST(AmxWeightGradient, MatmulBackwardAccumulatesItsResult) {
  // The engine's bf16 weight gradient goes through the kernel (split between the threads) where
  // the shape fits: d_weight += the kernel's fresh sum, bit for bit.
  if (!amx_packed_gemm_enabled()) GTEST_SKIP() << "no AMX on this CPU";
  const Case c{2048, 256, 96};  // a Linear [in 96 -> out 256] over 2,048 tokens
  const Operands o = operands(c, 0, 0, 700);
  const std::vector<float> before = random_vector(c.rows * c.columns, 701, 1.0f);
  std::vector<float> fresh(before.size());
  run_block(fresh, c.columns, o, c, WeightGradientUpdate::overwrite);
  MatmulEngine engine(MatmulOptions{});  // Lattice's AMX kernels on, whatever the environment
  std::vector<float> d_weight = before;
  Bf16Operands given;
  given.in = const_cast<lattice::bf16*>(o.X.data());
  given.d_out = o.D.data();
  engine.backward(nullptr, d_weight.data(), nullptr, nullptr, nullptr, nullptr, c.M, c.columns,
                  c.rows, Precision::bf16, given);
  for (size_t i = 0; i < before.size(); ++i) {
    const float expected = before[i] + fresh[i];
    ASSERT_EQ(0, std::memcmp(&d_weight[i], &expected, sizeof(float))) << "element " << i;
  }
}

TEST(AmxWeightGradient, ScratchForAnyTokenCountCoversEveryShorterCall) {
  // The LM head sizes one scratch per thread for its longest row chunk and reuses it for a shorter
  // last chunk, which may be summed in one block where the longer ones are not.
  for (WeightGradientUpdate update : kUpdates) {
    for (int64_t columns : {32, 256, 768, 1024}) {
      for (int64_t longest : {256, 600, 768, 1100}) {
        const size_t sized = amx_weight_gradient_scratch_bytes(longest, 77, columns, update);
        for (int64_t M = 0; M <= longest; M += 7)
          ASSERT_LE(amx_weight_gradient_scratch_bytes(M, 77, columns, update), sized)
              << name(update) << " columns " << columns << " M " << M << " of " << longest;
      }
    }
  }
}

TEST(AmxWeightGradient, RejectsShapesThatDoNotFitTheTiles) {
  EXPECT_TRUE(amx_weight_gradient_fits(32, 64));
  EXPECT_FALSE(amx_weight_gradient_fits(48, 64));
  EXPECT_FALSE(amx_weight_gradient_fits(50257, 768));
  EXPECT_FALSE(amx_weight_gradient_fits(0, 32));
  std::vector<float> dW(64 * 64);
  std::vector<lattice::bf16> D(64), X(64);
  std::vector<char> scratch(
      amx_weight_gradient_scratch_bytes(1, 64, 64, WeightGradientUpdate::overwrite));
  // The kernel checks its shapes inside its AMX translation unit (compiled for AMX and AVX-512):
  // on a host without them it cannot be entered at all.
  if (!amx_tile_state_granted()) GTEST_SKIP() << "no AMX tile state on this machine";
  // Columns must be a multiple of 32; rows need not be, but D's rows must reach the next multiple.
  EXPECT_THROW(amx_weight_gradient_block(dW.data(), 64, D.data(), 64, X.data(), 64, 1, 32, 48,
                                         WeightGradientUpdate::overwrite, scratch.data()),
               Error);
  EXPECT_THROW(amx_weight_gradient_block(dW.data(), 64, D.data(), 48, X.data(), 64, 1, 48, 64,
                                         WeightGradientUpdate::overwrite, scratch.data()),
               Error);
}

}  // namespace
}  // namespace lattice::kernels
