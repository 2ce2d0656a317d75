// Tests of DeepSeek-V2/V3's multi-head latent attention (AttentionDescription::latent,
// LatentProjection) in a transformer block: its gradients match finite differences with and
// without a query rank, its output and every gradient match PyTorch's DeepseekV3Attention
// (tests/reference/latent_attention_reference.py, committed data), bf16 stays within its rounding
// of fp32, the input and weight halves and selective recomputation equal the whole backward bit
// for bit, what its forward keeps is what saved_bytes says, under a context attention its RoPE
// follows the rows' positions (the runs'), and what it cannot run (a tensor-parallel size that
// does not divide the heads) is refused in one line. Tensor and context parallelism themselves are
// tested against one rank in test_tensor_parallel.cpp and through `lattice parity`
// (test_family_parity_cli.cpp), KV-cached generation against the full forward in test_kv_cache.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "block_gradient_check.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/block_description.hpp"
#include "lattice/model/context_parallel.hpp"
#include "lattice/model/kv_cache.hpp"
#include "lattice/model/transformer_block.hpp"

using namespace lattice;
using namespace lattice::model;
using lattice::testing::RandomizedBlock;
using lattice::testing::uniform_values;

namespace {

// The shapes of latent_attention_reference.py (keep in step).
constexpr int64_t kWidth = 32, kHeads = 4, kNope = 4, kRope = 4, kValue = 6, kKvRank = 12;
constexpr int64_t kQRank = 10, kHidden = 48;

// A DeepSeek-style block: multi-head latent attention (query rank `q_rank`, 0: q_proj) and a
// SwiGLU MLP, block RMSNorms of eps 1e-5 (the latent norms keep their own 1e-6).
BlockDescription latent_block(int64_t q_rank) {
  BlockDescription d;
  d.prefix = "model.layers.0.";
  d.d_model = kWidth;
  d.norm_eps = 1e-5f;
  AttentionDescription& a = d.attention;
  a.norm = "input_layernorm";
  a.norm_kind = NormKind::rms_norm;
  a.q = "self_attn.q_proj";
  a.out = "self_attn.o_proj";
  a.heads = a.kv_heads = kHeads;
  a.head_dim = kNope + kRope;
  a.v_head_dim = kValue;
  a.rope = true;
  a.latent.q_lora_rank = q_rank;
  a.latent.kv_lora_rank = kKvRank;
  a.latent.qk_nope_head_dim = kNope;
  a.latent.qk_rope_head_dim = kRope;
  d.mlp = SwiGluMlpDescription{"post_attention_layernorm",
                               NormKind::rms_norm,
                               {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", kHidden}};
  return d;
}

// The RoPE table of the rope channels (qk_rope_head_dim wide).
const kernels::RopeTable& rope_table() {
  static const kernels::RopeTable table{64, kRope, 10000.0f};
  return table;
}

// Rows of `width` floats (`stride` apart) of one sequence of n rows with its halves swapped: row
// r of `x` is row (r + n/2) % n of the result (its own inverse for even n).
std::vector<float> swap_halves(const float* x, int64_t n, int64_t width, int64_t stride) {
  std::vector<float> out(static_cast<size_t>(n * width));
  for (int64_t r = 0; r < n; ++r)
    std::copy(x + r * stride, x + r * stride + width, out.data() + (r + n / 2) % n * width);
  return out;
}
void unswap_halves(float* x, const std::vector<float>& ordered, int64_t n, int64_t width,
                   int64_t stride) {
  for (int64_t r = 0; r < n; ++r)
    std::copy(ordered.data() + (r + n / 2) % n * width,
              ordered.data() + ((r + n / 2) % n + 1) * width, x + r * stride);
}

// A context attention over one sequence whose rows hold its halves swapped: rows [0, n/2) are
// positions [n/2, n) and rows [n/2, n) positions [0, n/2) — runs that do not start at position 0
// and are not in position order, as a cp rank's. Its attention puts q, k, v (and out, d_out, lse)
// in position order, runs the kernel over the whole sequence and puts its results back.
class SwappedHalvesAttention : public ContextAttention {
 public:
  int size() const override { return 2; }
  int rank() const override { return 0; }
  std::vector<PositionRun> runs(int64_t n) const override {
    return {{0, n / 2, n / 2}, {n / 2, 0, n / 2}};
  }
  void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
               const float* v, const kernels::AttentionShape& local,
               kernels::Precision precision) override {
    ++calls;
    const Widths w(local);
    const auto sq = swap_halves(q, w.n, w.q, local.q_row_stride);
    const auto sk = swap_halves(k, w.n, w.k, local.k_row_stride);
    const auto sv = swap_halves(v, w.n, w.v, local.v_row_stride);
    std::vector<float> o(static_cast<size_t>(w.n * w.out)), l(static_cast<size_t>(w.h * w.n));
    ops.attention_forward(o.data(), l.data(), sq.data(), sk.data(), sv.data(), w.shape(local),
                          precision, {});
    unswap_halves(out, o, w.n, w.out, w.out);
    unswap_lse(lse, l, w);
  }
  void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                const float* q, const float* k, const float* v, const float* out, const float* lse,
                const kernels::AttentionShape& local, kernels::Precision precision) override {
    ++calls;
    const Widths w(local);
    const auto sq = swap_halves(q, w.n, w.q, local.q_row_stride);
    const auto sk = swap_halves(k, w.n, w.k, local.k_row_stride);
    const auto sv = swap_halves(v, w.n, w.v, local.v_row_stride);
    const auto so = swap_halves(out, w.n, w.out, w.out);
    const auto sd = swap_halves(d_out, w.n, w.out, w.out);
    std::vector<float> sl(static_cast<size_t>(w.h * w.n));
    for (int64_t h = 0; h < w.h; ++h) {
      const auto row = swap_halves(lse + h * w.n, w.n, 1, 1);
      std::copy(row.begin(), row.end(), sl.begin() + h * w.n);
    }
    std::vector<float> gq(sq.size()), gk(sk.size()), gv(sv.size());
    ops.attention_backward(gq.data(), gk.data(), gv.data(), sd.data(), sq.data(), sk.data(),
                           sv.data(), so.data(), sl.data(), w.shape(local), precision, {});
    unswap_halves(dq, gq, w.n, w.q, local.q_row_stride);
    unswap_halves(dk, gk, w.n, w.k, local.k_row_stride);
    unswap_halves(dv, gv, w.n, w.v, local.v_row_stride);
  }
  double take_wait_seconds() override { return 0; }
  int calls = 0;

 private:
  // One sequence's widths (B = 1).
  struct Widths {
    explicit Widths(const kernels::AttentionShape& s)
        : n(s.q_len),
          h(s.q_heads),
          q(s.q_heads * s.head_dim),
          k(s.kv_heads * s.head_dim),
          v(s.kv_heads * s.value_dim()),
          out(s.q_heads * s.value_dim()) {
      EXPECT_EQ(s.batch, 1);
    }
    // The contiguous whole-sequence call (causal from position 0).
    kernels::AttentionShape shape(const kernels::AttentionShape& local) const {
      kernels::AttentionShape s =
          kernels::AttentionShape::contiguous(1, n, local.q_heads, local.kv_heads, local.head_dim);
      s.v_head_dim = local.v_head_dim;
      s.v_row_stride = v;
      s.v_batch_stride = n * v;
      return s;
    }
    int64_t n, h, q, k, v, out;
  };
  static void unswap_lse(float* lse, const std::vector<float>& ordered, const Widths& w) {
    for (int64_t h = 0; h < w.h; ++h) {
      const std::vector<float> row(ordered.begin() + h * w.n, ordered.begin() + (h + 1) * w.n);
      unswap_halves(lse + h * w.n, row, w.n, 1, 1);
    }
  }
};

// The first line of what `f` throws as lattice::Error ("" when nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ||a - b|| / ||b||.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

// The block's output, input gradient and parameter gradients for x and d_out in `precision`.
struct BlockRun {
  std::vector<float> out, d_x, grads;
  // The gradient of parameter `p` (of the block's store).
  std::vector<float> grad(const ParameterInfo& p) const {
    return {grads.begin() + p.offset, grads.begin() + p.offset + p.numel};
  }
};
BlockRun run_block(RandomizedBlock& t, kernels::Precision precision, const std::vector<float>& x,
                   const std::vector<float>& d_out, int64_t B, int64_t T,
                   ContextAttention* context = nullptr) {
  kernels::CpuOps ops;
  LayerContext ctx{ops, precision, nullptr};
  ctx.context = context;
  t.store.zero_grads();
  BlockRun r{std::vector<float>(x.size()), std::vector<float>(x.size()), {}};
  auto saved = t.block->make_activations();
  t.block->forward(ctx, *saved, r.out.data(), x.data(), B, T);
  BackwardScratch scratch;
  t.block->backward(ctx, *saved, r.d_x.data(), d_out.data(), x.data(), B, T, scratch);
  r.grads.assign(t.store.grads(), t.store.grads() + t.store.size());
  return r;
}

}  // namespace

TEST(LatentAttention, GradientsMatchFiniteDifferencesWithAndWithoutAQueryRank) {
  for (int64_t q_rank : {kQRank, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_rank);
    lattice::testing::expect_block_gradients_match_finite_differences(latent_block(q_rank),
                                                                      &rope_table());
  }
}

TEST(LatentAttention, NamesAndShapesItsParametersAsHuggingFace) {
  RandomizedBlock with_rank(latent_block(kQRank), &rope_table());
  std::set<std::string> names;
  for (const auto& p : with_rank.store.parameters()) names.insert(p.name);
  const std::string at = "model.layers.0.self_attn.";
  const auto numel = [&](ParameterStore& store, const std::string& name) {
    return store.parameters()[static_cast<size_t>(store.index_of(at + name))].numel;
  };
  const int64_t qk = kNope + kRope;
  EXPECT_EQ(numel(with_rank.store, "q_a_proj.weight"), kQRank * kWidth);
  EXPECT_EQ(numel(with_rank.store, "q_a_layernorm.weight"), kQRank);
  EXPECT_EQ(numel(with_rank.store, "q_b_proj.weight"), kHeads * qk * kQRank);
  EXPECT_EQ(numel(with_rank.store, "kv_a_proj_with_mqa.weight"), (kKvRank + kRope) * kWidth);
  EXPECT_EQ(numel(with_rank.store, "kv_a_layernorm.weight"), kKvRank);
  EXPECT_EQ(numel(with_rank.store, "kv_b_proj.weight"), kHeads * (kNope + kValue) * kKvRank);
  EXPECT_EQ(numel(with_rank.store, "o_proj.weight"), kWidth * kHeads * kValue);
  EXPECT_FALSE(names.count(at + "q_proj.weight"));
  RandomizedBlock without_rank(latent_block(0), &rope_table());
  EXPECT_EQ(numel(without_rank.store, "q_proj.weight"), kHeads * qk * kWidth);
  EXPECT_THROW(without_rank.store.index_of(at + "q_a_proj.weight"), Error);
}

TEST(LatentAttention, MatchesThePyTorchReferenceOutputAndEveryGradient) {
  // DeepseekV3Attention in fp32 autograd (latent_attention_reference.py): the same arithmetic in
  // another order, so fp32 rounding only (outputs of order 1): 2e-5 absolute + 1e-4 relative.
  const SafetensorsFile reference(std::string(LATTICE_SOURCE_DIR) +
                                  "/tests/reference/data/latent_attention_reference.safetensors");
  const int64_t B = 2, T = 7, n = B * T * kWidth;
  for (const auto& [name, q_rank] :
       {std::pair<std::string, int64_t>{"with_q_rank", kQRank}, {"without_q_rank", 0}}) {
    SCOPED_TRACE(name);
    RandomizedBlock t(latent_block(q_rank), &rope_table());
    for (const auto& p : t.store.parameters())
      reference.read_f32(name + "/" + p.name, t.store.mutable_values() + p.offset, p.numel);
    auto read = [&](const std::string& key, int64_t count) {
      std::vector<float> v(static_cast<size_t>(count));
      reference.read_f32(name + "/" + key, v.data(), count);
      return v;
    };
    const std::vector<float> x = read("input", n), d_out = read("output_gradient", n);
    const BlockRun r = run_block(t, kernels::Precision::fp32, x, d_out, B, T);
    auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want,
                           const std::string& what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5 + 1e-4 * std::fabs(want[i])) << what << " element " << i;
    };
    expect_close(r.out, read("output", n), "output");
    expect_close(r.d_x, read("input_gradient", n), "input gradient");
    for (const auto& p : t.store.parameters()) {
      const std::vector<float> got = r.grad(p);
      expect_close(got, read("grad/" + p.name, p.numel), "gradient of " + p.name);
    }
  }
}

TEST(LatentAttention, TheSoftmaxScaleFactorIsTheQueriesScaledByIt) {
  // Yarn's mscale² on the softmax scale (DeepSeek-V3's long context): (f·q)·k·scale. Without a
  // query rank the same block with q_proj's weights times f computes the same queries (RoPE is
  // linear), so their outputs and input gradients agree to fp32 rounding, and q_proj's gradient
  // is f times the scaled weights' (the other weights' equal); finite differences check the
  // factor's backward with a query rank too.
  const float f = 1.3f;
  for (int64_t q_rank : {kQRank, int64_t{0}}) {
    BlockDescription scaled = latent_block(q_rank);
    scaled.attention.latent.softmax_scale_factor = f;
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_rank);
    lattice::testing::expect_block_gradients_match_finite_differences(scaled, &rope_table());
  }
  BlockDescription scaled = latent_block(0);
  scaled.attention.latent.softmax_scale_factor = f;
  RandomizedBlock with_factor(scaled, &rope_table()),
      scaled_weights(latent_block(0), &rope_table());
  const std::string q_proj = "model.layers.0.self_attn.q_proj.weight";
  const model::ParameterInfo& q =
      scaled_weights.store.parameters()[static_cast<size_t>(scaled_weights.store.index_of(q_proj))];
  for (int64_t i = 0; i < q.numel; ++i) scaled_weights.store.mutable_values()[q.offset + i] *= f;
  const int64_t B = 2, T = 8, n = B * T * kWidth;
  const std::vector<float> x = uniform_values(n, 9), d_out = uniform_values(n, 10);
  const BlockRun a = run_block(with_factor, kernels::Precision::fp32, x, d_out, B, T);
  const BlockRun b = run_block(scaled_weights, kernels::Precision::fp32, x, d_out, B, T);
  EXPECT_LT(relative_difference(a.out, b.out), 1e-6);
  EXPECT_LT(relative_difference(a.d_x, b.d_x), 1e-6);
  for (const auto& p : with_factor.store.parameters()) {
    const std::vector<float> got = a.grad(p);
    std::vector<float> want = b.grad(p);
    if (p.name == q_proj)
      for (float& g : want) g *= f;
    EXPECT_LT(relative_difference(got, want), 1e-5) << p.name;
  }
  // And the factor is not a no-op: the plain block's output differs (by 3e-4 of the whole output,
  // the residual included; fp32 rounding is 1e-7).
  RandomizedBlock plain(latent_block(0), &rope_table());
  const BlockRun c = run_block(plain, kernels::Precision::fp32, x, d_out, B, T);
  EXPECT_GT(relative_difference(a.out, c.out), 1e-5);
}

TEST(LatentAttention, Bf16StaysWithinItsRoundingOfFp32) {
  // bf16 rounds every GEMM operand to 8 significant bits (relative 2^-9 each): the output's
  // attention and MLP terms pass through 3 to 4 chained roundings and the gradients through twice
  // as many, so the whole vectors stay within ~1% of fp32 in norm (0.7% at most here, the output
  // 0.05%: its residual term is exact); 3% bounds them with room for other GEMM backends.
  const int64_t B = 2, T = 8, n = B * T * kWidth;
  const std::vector<float> x = uniform_values(n, 7), d_out = uniform_values(n, 8);
  for (int64_t q_rank : {kQRank, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_rank);
    RandomizedBlock t(latent_block(q_rank), &rope_table());
    const BlockRun fp32 = run_block(t, kernels::Precision::fp32, x, d_out, B, T);
    const BlockRun bf16 = run_block(t, kernels::Precision::bf16, x, d_out, B, T);
    EXPECT_LT(relative_difference(bf16.out, fp32.out), 3e-2);
    EXPECT_LT(relative_difference(bf16.d_x, fp32.d_x), 3e-2);
    for (const auto& p : t.store.parameters()) {
      EXPECT_LT(relative_difference(bf16.grad(p), fp32.grad(p)), 3e-2) << p.name;
    }
  }
}

TEST(LatentAttention, HalvesAndRecomputationEqualTheWholeBackwardBitForBit) {
  for (int64_t q_rank : {kQRank, int64_t{0}})
    for (kernels::Precision precision : {kernels::Precision::fp32, kernels::Precision::bf16}) {
      SCOPED_TRACE(::testing::Message()
                   << kernels::precision_name(precision) << " q_lora_rank " << q_rank);
      kernels::CpuOps ops;
      LayerContext ctx{ops, precision, nullptr};
      const int64_t B = 2, T = 8, n = B * T * kWidth;
      const std::vector<float> x = uniform_values(n, 4), d_out = uniform_values(n, 6);
      // run(mode): 0 the whole backward, 1 input then weight halves, 2 with selective recompute.
      auto run = [&](int mode, std::vector<float>& d_x) {
        RandomizedBlock t(latent_block(q_rank), &rope_table());
        auto saved = t.block->make_activations();
        saved->recompute_attention = mode == 2;
        std::vector<float> out(static_cast<size_t>(n));
        t.block->forward(ctx, *saved, out.data(), x.data(), B, T);
        BackwardScratch scratch;
        d_x.assign(static_cast<size_t>(n), 0.0f);
        if (mode == 1) {
          t.block->backward_input(ctx, *saved, d_x.data(), d_out.data(), x.data(), B, T, scratch);
          t.block->backward_weight(ctx, *saved, x.data(), B, T);
        } else {
          t.block->backward(ctx, *saved, d_x.data(), d_out.data(), x.data(), B, T, scratch);
        }
        return std::vector<float>(t.store.grads(), t.store.grads() + t.store.size());
      };
      std::vector<float> d_whole, d_halves, d_recomputed;
      const std::vector<float> whole = run(0, d_whole);
      EXPECT_EQ(run(1, d_halves), whole);
      EXPECT_EQ(d_halves, d_whole);
      EXPECT_EQ(run(2, d_recomputed), whole);
      EXPECT_EQ(d_recomputed, d_whole);
    }
}

TEST(LatentAttention, WhatTheForwardKeepsIsWhatSavedBytesSaysAndBackwardFitsItsScratch) {
  for (int64_t q_rank : {kQRank, int64_t{0}})
    for (kernels::Precision precision : {kernels::Precision::fp32, kernels::Precision::bf16}) {
      SCOPED_TRACE(::testing::Message()
                   << kernels::precision_name(precision) << " q_lora_rank " << q_rank);
      RandomizedBlock t(latent_block(q_rank), &rope_table());
      kernels::CpuOps ops;
      MemoryTracker tracker;
      LayerContext ctx{ops, precision, &tracker};
      const int64_t B = 2, T = 8, n = B * T * kWidth;
      const std::vector<float> x = uniform_values(n, 4);
      std::vector<float> out(static_cast<size_t>(n)), d_x(static_cast<size_t>(n));
      auto saved = t.block->make_activations();
      t.block->forward(ctx, *saved, out.data(), x.data(), B, T);
      const int64_t kept = tracker.current(MemoryCategory::activations);
      EXPECT_EQ(kept, t.block->saved_bytes(precision, B, T));
      // The forward's transients (kv_a's and kv_b's outputs) are within transient_bytes.
      EXPECT_LE(tracker.peak(MemoryCategory::activations) - kept,
                t.block->transient_bytes(precision, B, T));
      BackwardScratch scratch;
      t.block->backward(ctx, *saved, d_x.data(), x.data(), x.data(), B, T, scratch);
      // What backward grew beyond the saved tensors (its scratch slots) is what scratch_bytes says.
      EXPECT_LE(tracker.current(MemoryCategory::activations) - kept,
                t.block->scratch_bytes(precision, B, T));
    }
}

TEST(LatentAttention, RefusesWhatItCannotRunInOneLine) {
  // A tensor-parallel size that does not divide the heads (tp splits them).
  parallel::TensorParallelGroup three_ranks;
  three_ranks.size = 3;
  ParameterStore store;
  const std::string tp = error_of([&] {
    TransformerBlock(store, latent_block(kQRank), 0, parallel::SequenceLayout(three_ranks),
                     &rope_table());
  });
  EXPECT_NE(tp.find("parallelism.tp = 3 must divide the 4 attention heads"), std::string::npos)
      << tp;
  // A RoPE table of the whole head's width instead of the rope channels'.
  const kernels::RopeTable wide{64, kNope + kRope, 10000.0f};
  ParameterStore other;
  const std::string table = error_of(
      [&] { TransformerBlock(other, latent_block(kQRank), 0, parallel::SequenceLayout{}, &wide); });
  EXPECT_NE(table.find("build its RoPE table with head_dim qk_rope_head_dim"), std::string::npos)
      << table;
  for (const std::string& line : {tp, table}) EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST(LatentAttention, UnderAContextAttentionItsRopeFollowsTheRunsPositions) {
  // The block on one sequence's rows with its halves swapped, through a context attention whose
  // runs say so, equals the plain block on the sequence in order, rows swapped likewise: q's rope
  // channels and k_pe rotate at the runs' positions and their gradients rotate back at them
  // (rotated at the rows' indices instead, the output differs by 3e-4 relative, the residual
  // dominating it, and the gradients by up to 20%). Every row-wise layer computes the same rows;
  // the weight gradients sum the rows in another order (fp32 rounding, 1e-5 relative bounds it).
  const int64_t T = 8, n = T * kWidth;
  const std::vector<float> x = uniform_values(n, 7), d_out = uniform_values(n, 8);
  for (int64_t q_rank : {kQRank, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_rank);
    RandomizedBlock t(latent_block(q_rank), &rope_table());
    const BlockRun in_order = run_block(t, kernels::Precision::fp32, x, d_out, 1, T);
    SwappedHalvesAttention context;
    const BlockRun swapped =
        run_block(t, kernels::Precision::fp32, swap_halves(x.data(), T, kWidth, kWidth),
                  swap_halves(d_out.data(), T, kWidth, kWidth), 1, T, &context);
    EXPECT_EQ(context.calls, 2);  // its forward and backward ran
    EXPECT_LT(relative_difference(swapped.out, swap_halves(in_order.out.data(), T, kWidth, kWidth)),
              1e-5);
    EXPECT_LT(relative_difference(swapped.d_x, swap_halves(in_order.d_x.data(), T, kWidth, kWidth)),
              1e-5);
    for (const auto& p : t.store.parameters()) {
      EXPECT_LT(relative_difference(swapped.grad(p), in_order.grad(p)), 1e-5) << p.name;
    }
  }
}
