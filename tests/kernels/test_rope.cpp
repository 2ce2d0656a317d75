// Tests of the rotary position embedding: against a naive double implementation of Hugging Face's
// rotate_half formula, inverse(apply(x)) == x, the inverse as the adjoint (finite differences), and
// the pos_offset and stride handling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/rope.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

// Naive HF Llama RoPE on one [heads, D] token row in double. Like Hugging Face, the angle is the
// fp32 product position * inv_freq with inv_freq = 1 / theta^(2i/D) in fp32 (that rounding is part
// of the model's definition); cos, sin and the rotation are evaluated in double.
std::vector<double> naive_rope_row(const float* row, int64_t heads, int64_t D, int64_t position,
                                   float theta) {
  std::vector<double> out(static_cast<size_t>(heads * D));
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq =
          1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
      const double angle = static_cast<double>(static_cast<float>(position) * inv_freq);
      const double c = std::cos(angle), s = std::sin(angle);
      const double x1 = row[h * D + i], x2 = row[h * D + i + half];
      // q_embed = q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1).
      out[static_cast<size_t>(h * D + i)] = x1 * c - x2 * s;
      out[static_cast<size_t>(h * D + i + half)] = x2 * c + x1 * s;
    }
  return out;
}

// Every element of x outside the [batch, seq, heads*D] windows must be left alone.
struct StridedTensor {
  int64_t batch, seq, heads, D, row_stride, batch_stride;
  std::vector<float> data;
  float* at(int64_t b, int64_t t) { return data.data() + b * batch_stride + t * row_stride; }
};

StridedTensor make_strided(int64_t batch, int64_t seq, int64_t heads, int64_t D, int64_t row_pad,
                           int64_t extra_rows, uint64_t seed) {
  StridedTensor x{batch, seq, heads, D, heads * D + row_pad, 0, {}};
  x.batch_stride = (seq + extra_rows) * x.row_stride;
  x.data = random_vector(batch * x.batch_stride, seed);
  return x;
}

TEST(Rope, MatchesNaiveHuggingFaceFormulaWithOffsetAndStrides) {
  // Positions up to 2047 with theta 10000 and 500000 (Llama 2 / Llama 3). fp32 cos/sin of the fp32
  // angle are correctly rounded to ~1 ulp and the rotation adds two fp32 products: 1e-6 relative to
  // the inputs' scale bounds that; a wrong pair or sign gives errors of order 1.
  for (float theta : {10000.0f, 500000.0f}) {
    const int64_t B = 2, T = 48, H = 3, D = 64, offset = 2000;
    const RopeTable table(2048, D, theta);
    StridedTensor x = make_strided(B, T, H, D, /*row_pad=*/7, /*extra_rows=*/2, 5);
    const std::vector<float> original = x.data;
    rope_apply(table, x.data.data(), B, T, H, x.row_stride, x.batch_stride, offset, false);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float* before = original.data() + b * x.batch_stride + t * x.row_stride;
        const std::vector<double> expected = naive_rope_row(before, H, D, offset + t, theta);
        const float* after = x.at(b, t);
        std::vector<float> got(after, after + H * D);
        ASSERT_LT(max_relative_error(got, expected), 1e-6) << "b=" << b << " t=" << t;
        // Row padding is untouched.
        for (int64_t i = H * D; i < x.row_stride; ++i) ASSERT_EQ(after[i], before[i]);
      }
    // The extra rows at the end of each batch are untouched.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = T * x.row_stride; i < x.batch_stride; ++i)
        ASSERT_EQ(x.data[b * x.batch_stride + i], original[b * x.batch_stride + i]);
  }
}

TEST(Rope, PositionZeroIsIdentityAndOffsetShiftsPositions) {
  const RopeTable table(64, 16, 10000.0f);
  // Applying with pos_offset 10 to token 0 equals applying to token 10 of a longer sequence.
  std::vector<float> long_seq = random_vector(12 * 16, 7);
  std::vector<float> single(long_seq.begin() + 10 * 16, long_seq.begin() + 11 * 16);
  std::vector<float> first_token(long_seq.begin(), long_seq.begin() + 16);
  rope_apply(table, long_seq.data(), 1, 12, 1, 16, 12 * 16, 0, false);
  rope_apply(table, single.data(), 1, 1, 1, 16, 16, 10, false);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(single[i], long_seq[10 * 16 + i]);
  // Position 0: cos 1, sin 0, so x is unchanged exactly.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(first_token[i], long_seq[i]);
}

TEST(Rope, InverseUndoesApply) {
  // A rotation and its inverse in fp32: each output is two products and a sum, so the round trip
  // returns x within a few fp32 ulps of its scale (1e-6 relative).
  const int64_t B = 2, T = 33, H = 4, D = 32;
  const RopeTable table(100, D, 10000.0f);
  StridedTensor x = make_strided(B, T, H, D, 3, 1, 9);
  const std::vector<float> original = x.data;
  rope_apply(table, x.data.data(), B, T, H, x.row_stride, x.batch_stride, 40, false);
  EXPECT_GT(max_relative_error(x.data, original), 0.1);  // it did rotate
  rope_apply(table, x.data.data(), B, T, H, x.row_stride, x.batch_stride, 40, true);
  EXPECT_LT(max_relative_error(x.data, original), 1e-6);
}

TEST(Rope, InverseIsTheBackwardByFiniteDifferences) {
  // L(x) = sum w * rope(x). dL/dx must equal rope_inverse(w) (the adjoint of a rotation is its
  // inverse). RoPE is linear, so the central difference is exact up to fp32 rounding of L: with
  // step 0.05 that noise is ~1e-7 * |L| / 0.05 ~ 1e-5 relative; bound 1e-3.
  const int64_t B = 1, T = 5, H = 2, D = 8, offset = 3;
  const RopeTable table(16, D, 10000.0f);
  std::vector<float> x = random_vector(B * T * H * D, 11);
  const std::vector<float> w = random_vector(B * T * H * D, 12);
  auto loss = [&] {
    std::vector<float> y = x;
    rope_apply(table, y.data(), B, T, H, H * D, T * H * D, offset, false);
    return testing::weighted_sum(y, w);
  };
  const std::vector<double> numeric =
      testing::numerical_gradient(loss, x.data(), static_cast<int64_t>(x.size()), 0.05f);
  std::vector<float> analytic = w;
  rope_apply(table, analytic.data(), B, T, H, H * D, T * H * D, offset, true);
  EXPECT_LT(max_relative_error(analytic, numeric), 1e-3);
}

TEST(Rope, RejectsBadArguments) {
  EXPECT_THROW(RopeTable(16, 7, 10000.0f), Error);  // odd head_dim
  EXPECT_THROW(RopeTable(0, 8, 10000.0f), Error);
  const RopeTable table(16, 8, 10000.0f);
  std::vector<float> x(8 * 20, 0.0f);
  EXPECT_THROW(rope_apply(table, x.data(), 1, 10, 1, 8, 80, 7, false),
               Error);  // positions 7..16 > 16
  EXPECT_THROW(rope_apply(table, x.data(), 1, 4, 2, 8, 64, 0, false),
               Error);  // row_stride < heads*D
}

}  // namespace
}  // namespace lattice::kernels
