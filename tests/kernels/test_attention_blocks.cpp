// Tests of attention over blocks of keys (ring attention, chunked long sequences): forward results
// over the blocks merged through their log-sum-exps equal the full forward, the merge's edge cases
// (parts that saw no key), and backwards run block by block with the final out and lse, dq
// accumulated, equal the full backward; fp32 and both bf16 paths.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"

namespace lattice::kernels {
namespace {

using namespace attention_testing;
using testing::max_relative_error;
using testing::random_vector;

// The keys of `in` split at `bounds` (first key of each block, then Tk): each block's shape is the
// full one with its kv_len, its first position as k_offset and the full call's query positions.
struct KeyBlock {
  int64_t first = 0, length = 0;
};

std::vector<KeyBlock> key_blocks(const std::vector<int64_t>& bounds) {
  std::vector<KeyBlock> blocks;
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    blocks.push_back({bounds[i], bounds[i + 1] - bounds[i]});
  return blocks;
}

AttentionShape block_shape(const AttentionShape& full, const KeyBlock& block) {
  AttentionShape s = full;
  s.q_offset = full.query_offset();
  s.k_offset = full.k_offset + block.first;
  s.kv_len = block.length;
  return s;
}

// Forward over the key blocks, merged: out starts at 0 and lse at -inf.
Forward merged_forward(const Inputs& in, const std::vector<KeyBlock>& blocks, Precision precision,
                       const AttentionOptions& options) {
  Forward merged;
  merged.out.assign(static_cast<size_t>(in.out_size()), 0.0f);
  merged.lse.assign(static_cast<size_t>(in.lse_size()), -std::numeric_limits<float>::infinity());
  Forward part = merged;
  MatmulEngine engine;
  for (const KeyBlock& block : blocks) {
    const AttentionShape s = block_shape(in.s, block);
    const int64_t row = block.first * in.s.k_row_stride;
    attention_forward(part.out.data(), part.lse.data(), in.q(), in.k() + row, in.v() + row, s,
                      precision, engine, options);
    attention_merge_partial(merged.out.data(), merged.lse.data(), part.out.data(), part.lse.data(),
                            s.batch, s.q_len, s.q_heads, s.value_dim());
  }
  return merged;
}

// Cases split into key blocks: aligned and unaligned to the 64/128-key tiles, a block no query
// sees at all, a block some queries do not see; causal and no mask; a sliding window.
struct BlockCase {
  Case c;
  std::vector<int64_t> bounds;
};

std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> cases;
  Case training;  // the default rule: queries are the last 150 of 200 key positions
  training.B = 2, training.Tq = 150, training.Tk = 200, training.Hq = 4, training.Hkv = 2;
  training.D = 32;
  cases.push_back({training, {0, 64, 150, 200}});
  Case ring = training;  // queries at 1000..1149, keys at 900..1099 (a future block at the end)
  ring.q_offset = 1000, ring.k_offset = 900, ring.Tk = 260, ring.D = 24, ring.Hkv = 1;
  cases.push_back({ring, {0, 128, 250, 260}});
  Case unmasked = training;
  unmasked.mask = AttentionMask::none, unmasked.Tq = 70, unmasked.row_pad = 3;
  cases.push_back({unmasked, {0, 77, 100, 200}});
  // Ring steps under a sliding window with narrower value heads: the first block lies wholly
  // before some queries' windows, the last is partly in the future.
  Case windowed = ring;
  windowed.window = 150, windowed.Dv = 16;
  cases.push_back({windowed, {0, 64, 190, 260}});
  return cases;
}

TEST(AttentionKeyBlocks, MergedForwardEqualsFullForward) {
  // Tolerance 4e-6 relative to the outputs' scale (lse: to max(|lse|, 1)): each block computes
  // its part as the full call would, and the merge rescales and adds them in double, so only the
  // changed order of the fp32 sums differs, a few units of fp32 rounding (2^-23 = 1.2e-7 each;
  // about 5e-7 seen on an AMX host); any masking or offset mistake is of order 1.
  uint64_t seed = 5000;
  for (const BlockCase& bc : block_cases()) {
    SCOPED_TRACE(bc.c.name());
    const Inputs in = make_inputs(bc.c, seed += 10);
    const Forward full = run_forward(in, Precision::fp32);
    const Forward merged = merged_forward(in, key_blocks(bc.bounds), Precision::fp32, {});
    std::vector<double> full_out(full.out.begin(), full.out.end());
    std::vector<double> full_lse(full.lse.begin(), full.lse.end());
    EXPECT_LE(error_relative_to(merged.out, full_out, max_abs(full_out)), 4e-6);
    expect_lse_matches(merged.lse, full_lse, 4e-6);
    // And the merged result against the naive reference, as the full one is.
    const Reference ref = naive_attention(in, false);
    EXPECT_LE(error_relative_to(merged.out, ref.out, max_abs(ref.out)), kFp32Tolerance);
  }
}

TEST(AttentionKeyBlocks, MergeHandlesPartsThatSawNoKey) {
  // A part with lse -inf changes nothing (bit for bit); a running result with lse -inf takes the
  // part as it is; two equal parts merge to the same output with lse + log 2.
  const int64_t B = 1, T = 3, H = 2, D = 4;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> out0 = random_vector(B * T * H * D, 1),
                           part = random_vector(B * T * H * D, 2);
  const std::vector<float> lse0 = {0.5f, -inf, 2.0f, 1.0f, -inf, 3.0f};
  const std::vector<float> part_lse = {-inf, 1.5f, 2.0f, -inf, -inf, 3.0f};
  std::vector<float> out = out0, lse = lse0;
  attention_merge_partial(out.data(), lse.data(), part.data(), part_lse.data(), B, T, H, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t l = static_cast<size_t>(h * T + t), row = static_cast<size_t>((t * H + h) * D);
      SCOPED_TRACE(::testing::Message() << "t=" << t << " h=" << h);
      const std::vector<float> got(out.begin() + row, out.begin() + row + D);
      const std::vector<float> was(out0.begin() + row, out0.begin() + row + D);
      const std::vector<float> p(part.begin() + row, part.begin() + row + D);
      if (part_lse[l] == -inf) {
        EXPECT_EQ(got, was);
        EXPECT_EQ(lse[l], lse0[l]);
      } else if (lse0[l] == -inf) {
        EXPECT_EQ(got, p);
        EXPECT_EQ(lse[l], part_lse[l]);
      } else {  // equal weights: the mean, lse + log 2
        for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(got[d], 0.5f * (was[d] + p[d]));
        EXPECT_FLOAT_EQ(lse[l], lse0[l] + std::log(2.0f));
      }
    }
  // Both -inf (t = 1, h = 1): the output stays as it was and lse -inf.
  EXPECT_EQ(lse[static_cast<size_t>(1 * T + 1)], -inf);
}

// Backward block by block: the final (full) out and lse, dq accumulated from zero, each block's
// dk and dv written into its rows.
Backward blockwise_backward(const Inputs& in, const Forward& final_result,
                            const std::vector<KeyBlock>& blocks, Precision precision,
                            AttentionOptions options) {
  Backward g;
  g.dq_buf.assign(in.q_buf.size(), std::numeric_limits<float>::quiet_NaN());
  g.dkv_buf.assign(in.kv_buf.size(), std::numeric_limits<float>::quiet_NaN());
  // dq's own elements zeroed (accumulate_dq adds to them), padding left NaN.
  for (int64_t b = 0; b < in.s.batch; ++b)
    for (int64_t t = 0; t < in.s.q_len; ++t)
      std::fill_n(g.dq() + b * in.s.q_batch_stride + t * in.s.q_row_stride,
                  in.s.q_heads * in.s.head_dim, 0.0f);
  options.accumulate_dq = true;
  MatmulEngine engine;
  for (const KeyBlock& block : blocks) {
    const AttentionShape s = block_shape(in.s, block);
    const int64_t row = block.first * in.s.k_row_stride;
    attention_backward(g.dq(), g.dk() + row, g.dv(in.s) + row, in.d_out.data(), in.q(),
                       in.k() + row, in.v() + row, final_result.out.data(), final_result.lse.data(),
                       s, precision, engine, options);
  }
  return g;
}

TEST(AttentionKeyBlocks, BlockBackwardsSumToTheFullBackward) {
  // Each block recomputes its probabilities from the final lse exactly as the full backward does
  // (in bf16 too: the same rounding of the same values), so dk and dv of a block and each block's
  // dq contribution are the full call's sums over the same terms; only dq's fp32 sum over the
  // blocks runs in another order (about 5e-7 seen on an AMX host; dk and dv came out bit-equal).
  // Tolerance 4e-6 of the largest gradient, for fp32 and bf16 alike.
  uint64_t seed = 6000;
  for (const BlockCase& bc : block_cases()) {
    SCOPED_TRACE(bc.c.name());
    const Inputs in = make_inputs(bc.c, seed += 10);
    const auto blocks = key_blocks(bc.bounds);
    const auto check = [&](Precision precision, const AttentionOptions& options) {
      const Forward full = run_forward(in, precision, options);
      const Backward expected = run_backward(in, full, precision, options);
      const Backward got = blockwise_backward(in, full, blocks, precision, options);
      const std::vector<double> dq = expected.dense_dq(in.s), dk = expected.dense_dk(in.s),
                                dv = expected.dense_dv(in.s);
      const double scale = std::max({max_abs(dq), max_abs(dk), max_abs(dv)});
      EXPECT_LE(error_relative_to(got.dense_dq(in.s), dq, scale), 4e-6);
      EXPECT_LE(error_relative_to(got.dense_dk(in.s), dk, scale), 4e-6);
      EXPECT_LE(error_relative_to(got.dense_dv(in.s), dv, scale), 4e-6);
      // Padding untouched, every gradient element written.
      int64_t nan_written = 0;
      for (size_t i = 0; i < got.dq_buf.size(); ++i)
        nan_written += std::isnan(got.dq_buf[i]) != std::isnan(expected.dq_buf[i]);
      for (size_t i = 0; i < got.dkv_buf.size(); ++i)
        nan_written += std::isnan(got.dkv_buf[i]) != std::isnan(expected.dkv_buf[i]);
      EXPECT_EQ(nan_written, 0);
    };
    {
      SCOPED_TRACE("fp32");
      check(Precision::fp32, {});
    }
    for_each_bf16_path([&](const AttentionOptions& options) { check(Precision::bf16, options); });
    // And the fp32 blocks against the naive reference.
    const Reference ref = naive_attention(in, true);
    const Forward full = run_forward(in, Precision::fp32);
    const Backward got = blockwise_backward(in, full, blocks, Precision::fp32, {});
    expect_gradients_match(got, ref, in.s, kFp32Tolerance);
  }
}

}  // namespace
}  // namespace lattice::kernels
