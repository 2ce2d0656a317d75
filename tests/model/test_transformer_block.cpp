// Tests of the one block type composed from descriptions: the families' descriptions name their
// parameters as Hugging Face does, a composition no family uses yet (rotary grouped-query attention
// with q/k/v biases beside a GELU MLP; with a q/k norm; with value heads narrower than the
// query-key heads) gets finite-difference gradients, its input and weight halves equal its whole
// backward bit for bit, selective recomputation equals keeping the attention output, and what its
// forward keeps is what saved_bytes says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "block_gradient_check.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/block_description.hpp"
#include "lattice/model/transformer_block.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

constexpr int64_t kWidth = 32, kHeads = 4, kKvHeads = 2, kHidden = 48;

// Llama's attention with biases on q, k and v (as Qwen 2.5 has them) and GPT-2's GELU MLP behind
// an RMSNorm: a block no preset builds, assembled from the components' options alone.
BlockDescription composed_block() {
  BlockDescription d;
  d.prefix = "model.layers.0.";
  d.d_model = kWidth;
  AttentionDescription& a = d.attention;
  a.norm = "input_layernorm";
  a.norm_kind = NormKind::rms_norm;
  a.q = "self_attn.q_proj";
  a.k = "self_attn.k_proj";
  a.v = "self_attn.v_proj";
  a.out = "self_attn.o_proj";
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = kWidth / kHeads;
  a.input_bias = true;
  a.rope = true;
  d.mlp = GeluMlpDescription{"post_attention_layernorm", "mlp.fc", "mlp.proj",
                             NormKind::rms_norm,         kHidden,  true};
  return d;
}

// The composed block with Qwen 3's per-head q/k RMSNorm before RoPE.
BlockDescription qk_norm_block() {
  BlockDescription d = composed_block();
  d.attention.q_norm = "self_attn.q_norm";
  d.attention.k_norm = "self_attn.k_norm";
  return d;
}

// The composed block with value heads half as wide as its query-key heads (DeepSeek's multi-head
// latent attention has 128-wide values beside 192-wide queries and keys): v_proj and o_proj
// narrower, RoPE on the full query-key heads.
BlockDescription narrow_value_block() {
  BlockDescription d = composed_block();
  d.attention.v_head_dim = kWidth / kHeads / 2;
  return d;
}

// A block of `d` on its own store with random weights (biases and norm weights too, so that every
// gradient term is visible).
struct BlockUnderTest {
  ParameterStore store;
  kernels::RopeTable rope{64, kWidth / kHeads, 10000.0f};
  std::unique_ptr<TransformerBlock> block;

  explicit BlockUnderTest(const BlockDescription& d) {
    block = std::make_unique<TransformerBlock>(store, d, 0, parallel::SequenceLayout{}, &rope);
    store.allocate(nullptr);
    Rng rng(5);
    for (int64_t i = 0; i < store.size(); ++i)
      store.mutable_values()[i] = 0.3f * static_cast<float>(rng.uniform() * 2 - 1);
    store.zero_grads();
  }
};

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform() * 2 - 1);
  return v;
}

}  // namespace

TEST(BlockDescription, FamiliesNameTheirParametersAsHuggingFace) {
  ParameterStore gpt2;
  TransformerBlock(gpt2, describe_block(model_preset("gpt2-tiny"), 1), 1, {}, nullptr);
  std::set<std::string> names;
  for (const auto& p : gpt2.parameters()) names.insert(p.name);
  const std::set<std::string> expected = {
      "transformer.h.1.ln_1.weight",        "transformer.h.1.ln_1.bias",
      "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias",
      "transformer.h.1.attn.c_proj.weight", "transformer.h.1.attn.c_proj.bias",
      "transformer.h.1.ln_2.weight",        "transformer.h.1.ln_2.bias",
      "transformer.h.1.mlp.c_fc.weight",    "transformer.h.1.mlp.c_fc.bias",
      "transformer.h.1.mlp.c_proj.weight",  "transformer.h.1.mlp.c_proj.bias"};
  EXPECT_EQ(names, expected);
  // A DeepSeek-style MoE layer: the router and experts under "mlp.", the shared experts beside.
  const ModelConfig deepseek = model_preset("deepseek-moe-tiny");
  const kernels::RopeTable rope(deepseek.max_seq_len, deepseek.head_dim(), deepseek.rope_theta);
  ParameterStore moe;
  TransformerBlock(moe, describe_block(deepseek, 1), 1, {}, &rope);
  EXPECT_NO_THROW(moe.index_of("model.layers.1.mlp.gate.weight"));
  EXPECT_NO_THROW(moe.index_of("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_NO_THROW(moe.index_of("model.layers.1.mlp.shared_experts.up_proj.weight"));
  EXPECT_NO_THROW(moe.index_of("model.layers.1.post_attention_layernorm.weight"));
}

// The block's parameter and input gradients against central differences of its forward
// (block_gradient_check.hpp).
void expect_gradients_match_finite_differences(const BlockDescription& d) {
  const kernels::RopeTable rope{64, kWidth / kHeads, 10000.0f};
  lattice::testing::expect_block_gradients_match_finite_differences(d, &rope);
}

TEST(TransformerBlock, ComposedBlockMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(composed_block());
}

TEST(TransformerBlock, SlidingWindowHidesOlderPositionsAndItsGradientsMatchFiniteDifferences) {
  // A window of 3 on 7 positions: positions 0-2 see every earlier key either way (their outputs
  // are the unwindowed block's, bit for bit: same weights, same per-row arithmetic), later ones
  // lose the oldest keys (their outputs change); the gradients stay exact.
  BlockDescription windowed = composed_block();
  windowed.attention.sliding_window = 3;
  BlockUnderTest plain(composed_block()), with_window(windowed);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t B = 2, T = 7;
  const std::vector<float> x = random_values(B * T * kWidth, 1);
  std::vector<float> out_plain(x.size()), out_window(x.size());
  auto saved = plain.block->make_activations();
  plain.block->forward(ctx, *saved, out_plain.data(), x.data(), B, T);
  saved = with_window.block->make_activations();
  with_window.block->forward(ctx, *saved, out_window.data(), x.data(), B, T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const auto row = static_cast<size_t>((b * T + t) * kWidth);
      const bool same = std::equal(out_plain.begin() + row, out_plain.begin() + row + kWidth,
                                   out_window.begin() + row);
      EXPECT_EQ(same, t < 3) << "batch " << b << " position " << t;
    }
  expect_gradients_match_finite_differences(windowed);
}

TEST(TransformerBlock, QkNormBlockMatchesFiniteDifferencesAndNamesItsNorms) {
  expect_gradients_match_finite_differences(qk_norm_block());
  ParameterStore store;
  kernels::RopeTable rope{64, kWidth / kHeads, 10000.0f};
  TransformerBlock(store, qk_norm_block(), 0, parallel::SequenceLayout{}, &rope);
  std::set<std::string> names;
  for (const auto& p : store.parameters()) names.insert(p.name);
  EXPECT_TRUE(names.count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(names.count("model.layers.0.self_attn.k_norm.weight"));
}

TEST(TransformerBlock, NarrowValueHeadsMatchFiniteDifferencesAndShapeTheirProjections) {
  expect_gradients_match_finite_differences(narrow_value_block());
  BlockUnderTest t(narrow_value_block());
  const int64_t head = kWidth / kHeads, value = head / 2;
  const auto numel = [&](const std::string& name) {
    return t.store.parameters()[static_cast<size_t>(t.store.index_of(name))].numel;
  };
  EXPECT_EQ(numel("model.layers.0.self_attn.v_proj.weight"), kKvHeads * value * kWidth);
  EXPECT_EQ(numel("model.layers.0.self_attn.o_proj.weight"), kWidth * kHeads * value);
  EXPECT_EQ(numel("model.layers.0.self_attn.k_proj.weight"), kKvHeads * head * kWidth);
}

TEST(TransformerBlock, WhatTheForwardKeepsIsWhatSavedBytesSays) {
  for (const BlockDescription& d : {composed_block(), qk_norm_block(), narrow_value_block()})
    for (kernels::Precision precision : {kernels::Precision::fp32, kernels::Precision::bf16}) {
      SCOPED_TRACE(::testing::Message()
                   << kernels::precision_name(precision) << " v_head_dim " << d.attention.v_head_dim
                   << " q/k norm " << !d.attention.q_norm.empty());
      BlockUnderTest t(d);
      kernels::CpuOps ops;
      MemoryTracker tracker;
      LayerContext ctx{ops, precision, &tracker};
      const int64_t B = 2, T = 8, n = B * T * kWidth;
      const std::vector<float> x = random_values(n, 4);
      std::vector<float> out(static_cast<size_t>(n));
      auto saved = t.block->make_activations();
      t.block->forward(ctx, *saved, out.data(), x.data(), B, T);
      EXPECT_EQ(tracker.current(MemoryCategory::activations),
                t.block->saved_bytes(precision, B, T));
    }
}

TEST(TransformerBlock, HalvesAndRecomputationEqualTheWholeBackwardBitForBit) {
  for (const BlockDescription& d : {composed_block(), qk_norm_block(), narrow_value_block()})
    for (kernels::Precision precision : {kernels::Precision::fp32, kernels::Precision::bf16}) {
      SCOPED_TRACE(::testing::Message()
                   << kernels::precision_name(precision) << " v_head_dim " << d.attention.v_head_dim
                   << " q/k norm " << !d.attention.q_norm.empty());
      kernels::CpuOps ops;
      LayerContext ctx{ops, precision, nullptr};
      const int64_t B = 2, T = 8, n = B * T * kWidth;
      const std::vector<float> x = random_values(n, 4), d_out = random_values(n, 6);
      // run(mode): 0 the whole backward, 1 input then weight halves, 2 with selective recompute.
      auto run = [&](int mode, std::vector<float>& d_x) {
        BlockUnderTest t(d);
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
