// Tests of the model: parameter names and counts, whole-model finite-difference gradients for GPT-2
// and Llama, pipeline-stage seams equal to the whole model, gradient accumulation, and the bf16 LM
// head's backward inside its forward against the separate one.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/core/scoped_omp_threads.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

ModelConfig tiny(Family family) {
  ModelConfig c = model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.init_std = 0.2f;  // larger weights than GPT-2's 0.02 make every gradient term visible
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(V))));
    b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(V))));
  }
  b.targets[1] = -1;  // one ignored target
  return b;
}

}  // namespace

TEST(ModelConfig, ParameterCountsMatchPublishedModels) {
  // GPT-2 small has 124,439,808 parameters (Hugging Face "gpt2", tied head).
  EXPECT_EQ(model_preset("gpt2-124m").parameter_count(), 124439808);
  // GPT-2 medium: 354,823,168.
  EXPECT_EQ(model_preset("gpt2-350m").parameter_count(), 354823168);
  // Qwen 2.5 0.5B: 494,032,768 (tied head; the q/k/v biases counted); 7B: "7.61B" (model cards).
  EXPECT_EQ(model_preset("qwen2.5-0.5b").parameter_count(), 494032768);
  EXPECT_NEAR(static_cast<double>(model_preset("qwen2.5-7b").parameter_count()) / 7.61e9, 1.0,
              1e-3);
  // The store of a built model holds exactly that many values (padding aside).
  MemoryTracker tracker;
  Transformer llama(model_preset("llama-tiny"), &tracker);
  int64_t total = 0;
  for (const auto& p : llama.parameters().parameters()) total += p.numel;
  EXPECT_EQ(total, model_preset("llama-tiny").parameter_count());
  // Qwen 2's closed form counts its q/k/v biases.
  Transformer qwen(model_preset("qwen2-tiny"), &tracker);
  total = 0;
  for (const auto& p : qwen.parameters().parameters()) total += p.numel;
  EXPECT_EQ(total, model_preset("qwen2-tiny").parameter_count());
}

TEST(ModelConfig, DeepSeekV3CountsMatchThePublishedModel) {
  // DeepSeek-V3 (its Hugging Face checkpoint without the multi-token-prediction module, embeddings
  // and head included): 671B parameters, 37B activated per token.
  const ModelConfig v3 = model_preset("deepseek-v3");
  EXPECT_NEAR(static_cast<double>(v3.parameter_count()) / 671e9, 1.0, 0.01);
  EXPECT_NEAR(static_cast<double>(v3.active_parameter_count()) / 37e9, 1.0, 0.03);
  EXPECT_EQ(Transformer::parameter_count(v3), v3.parameter_count());
  // The first three layers are dense, every later one a MoE layer; the RoPE table is the rope
  // channels' width, a head the nope and rope channels'.
  EXPECT_FALSE(v3.is_moe_layer(2));
  EXPECT_TRUE(v3.is_moe_layer(3));
  EXPECT_EQ(v3.moe_layers(), 58);
  EXPECT_EQ(v3.head_dim(), 192);
  EXPECT_EQ(v3.rope_head_dim(), 64);
  // The tiny one built for real holds exactly its closed form.
  MemoryTracker tracker;
  const ModelConfig tiny = model_preset("deepseek-v3-tiny");
  Transformer built(tiny, &tracker);
  int64_t total = 0;
  for (const auto& p : built.parameters().parameters()) total += p.numel;
  EXPECT_EQ(total, tiny.parameter_count());
}

TEST(ModelConfig, RefusesInconsistentLatentAttention) {
  auto refused = [](ModelConfig c, const std::string& fragment) {
    try {
      c.validate();
      ADD_FAILURE() << "accepted; expected a refusal naming " << fragment;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  };
  const ModelConfig tiny = model_preset("deepseek-v3-tiny");
  EXPECT_NO_THROW(tiny.validate());
  ModelConfig c = tiny;
  c.qk_rope_head_dim = 7;
  refused(c, "qk_rope_head_dim (7) must be even");
  c = tiny;
  c.family = Family::llama;
  refused(c, "deepseek family only");
  c = tiny;
  c.n_kv_heads = 2;
  refused(c, "model.n_kv_heads = model.n_heads");
  c = tiny;
  c.v_head_dim = 0;
  refused(c, "v_head_dim");
  c = tiny;
  c.explicit_head_dim = 16;
  refused(c, "leave it at 0");
  c = model_preset("llama-tiny");
  c.qk_nope_head_dim = 8;
  refused(c, "model.kv_lora_rank > 0");
  c = tiny;
  c.moe_first_dense_layers = 3;
  refused(c, "moe_first_dense_layers = 3");
}

TEST(Transformer, ParameterCountDeclaresWithoutAllocating) {
  // The declare-only count equals the built store's elements, for both families, tied and untied,
  // and for stages (an untied copy of a tied head on the last stage counts on that stage).
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "deepseek-v3-tiny"}) {
    for (bool tied : {true, false}) {
      ModelConfig c = model_preset(name);
      c.tied_embeddings = tied;
      for (StageRange range : {StageRange{}, StageRange{0, 1}, StageRange{1, -1}}) {
        MemoryTracker tracker;
        Transformer built(c, &tracker, range);
        int64_t total = 0;
        for (const auto& p : built.parameters().parameters()) total += p.numel;
        EXPECT_EQ(Transformer::parameter_count(c, range), total) << name << " tied=" << tied;
        EXPECT_GT(tracker.current(MemoryCategory::parameters), 0);
      }
    }
  }
  // A 124M model counted without a byte of parameters allocated.
  EXPECT_EQ(Transformer::parameter_count(model_preset("gpt2-124m")), 124439808);
}

TEST(ModelConfig, RejectsDimensionsThatDoNotFit) {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_heads = 5;
  EXPECT_THROW(c.validate(), Error);
  c = model_preset("llama-tiny");
  c.n_kv_heads = 3;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

TEST(Transformer, UsesHuggingFaceParameterNames) {
  Transformer gpt(model_preset("gpt2-tiny"), nullptr);
  EXPECT_NO_THROW(gpt.parameters().index_of("transformer.h.1.attn.c_attn.weight"));
  EXPECT_NO_THROW(gpt.parameters().index_of("transformer.wpe.weight"));
  EXPECT_THROW(gpt.parameters().index_of("lm_head.weight"), Error);  // tied to wte
  Transformer llama(model_preset("llama-tiny"), nullptr);
  EXPECT_NO_THROW(llama.parameters().index_of("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_NO_THROW(llama.parameters().index_of("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_NO_THROW(llama.parameters().index_of("lm_head.weight"));
  EXPECT_THROW(llama.parameters().index_of("model.layers.0.self_attn.q_proj.bias"), Error);
  // Qwen 2: Llama's names, biases on q, k and v only, the tiny preset's head tied.
  Transformer qwen(model_preset("qwen2-tiny"), nullptr);
  for (const char* name :
       {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias",
        "model.layers.1.self_attn.v_proj.bias"})
    EXPECT_NO_THROW(qwen.parameters().index_of(name)) << name;
  for (const char* name : {"model.layers.0.self_attn.o_proj.bias",
                           "model.layers.0.mlp.gate_proj.bias", "lm_head.weight"})
    EXPECT_THROW(qwen.parameters().index_of(name), Error) << name;
}

class WholeModelGradient : public ::testing::TestWithParam<Family> {};

TEST_P(WholeModelGradient, MatchesFiniteDifferences) {
  const ModelConfig config = tiny(GetParam());
  Transformer model(config, nullptr);
  model.initialize(7);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t B = 2, T = 9;
  Batch batch = random_batch(B, T, config.vocab_size, 3);
  auto& params = model.parameters();
  params.zero_grads();
  model.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, 1.0f);
  model.backward(ctx);
  std::vector<float> analytic(params.grads(), params.grads() + params.size());

  // Probe a few elements of every parameter.
  Rng pick(11);
  int checked = 0;
  for (const auto& p : params.parameters()) {
    for (int probe = 0; probe < 3; ++probe) {
      const int64_t index =
          p.offset + static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.numel)));
      // The writable pointer taken anew for every write, as the store asks of its writers.
      auto value = [&]() -> float& { return params.mutable_values()[index]; };
      const float saved = value(), step = 1e-2f;
      value() = saved + step;
      double plus = model.evaluate(ctx, batch.tokens.data(), batch.targets.data(), B, T);
      value() = saved - step;
      double minus = model.evaluate(ctx, batch.tokens.data(), batch.targets.data(), B, T);
      value() = saved;
      const double numeric = (plus - minus) / (2.0 * step);
      // fp32 loss evaluation carries ~1e-6 absolute noise, divided by 2·step = 0.02 gives ~5e-5;
      // the O(step^2) truncation term is of the same order. Hence 2e-4 absolute + 2% relative.
      EXPECT_NEAR(analytic[static_cast<size_t>(index)], numeric, 2e-4 + 0.02 * std::fabs(numeric))
          << p.name << " element " << index - p.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

INSTANTIATE_TEST_SUITE_P(Families, WholeModelGradient,
                         ::testing::Values(Family::gpt2, Family::llama));

class StageSeam : public ::testing::TestWithParam<Family> {};

TEST_P(StageSeam, TwoStagesEqualTheWholeModelBitForBit) {
  ModelConfig config = tiny(GetParam());
  config.tied_embeddings = false;  // a tied head across stages needs the pipeline's weight sync
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t B = 2, T = 8;
  Batch batch = random_batch(B, T, config.vocab_size, 5);

  Transformer whole(config, nullptr);
  whole.initialize(21);
  whole.parameters().zero_grads();
  const float loss = whole.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, 1.0f);
  whole.backward(ctx);

  Transformer first(config, nullptr, StageRange{0, 1});
  Transformer last(config, nullptr, StageRange{1, -1});
  first.initialize(21);
  last.initialize(21);
  first.parameters().zero_grads();
  last.parameters().zero_grads();
  first.forward_stage(ctx, batch.tokens.data(), nullptr, nullptr, B, T, 1.0f);
  const float staged_loss =
      last.forward_stage(ctx, nullptr, first.hidden_out(), batch.targets.data(), B, T, 1.0f);
  last.backward_stage(ctx, nullptr);
  first.backward_stage(ctx, last.d_hidden_in());
  EXPECT_EQ(loss, staged_loss);
  for (Transformer* stage : {&first, &last}) {
    for (const auto& p : stage->parameters().parameters()) {
      const int w = whole.parameters().index_of(p.name);
      for (int64_t i = 0; i < p.numel; ++i) {
        ASSERT_EQ(stage->parameters().value(stage->parameters().index_of(p.name))[i],
                  whole.parameters().value(w)[i]);
        ASSERT_EQ(stage->parameters().grads()[p.offset + i],
                  whole.parameters().grads()[whole.parameters().info(w).offset + i])
            << p.name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, StageSeam, ::testing::Values(Family::gpt2, Family::llama));

TEST(Transformer, GradientAccumulationEqualsOneLargeBatch) {
  const ModelConfig config = tiny(Family::llama);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t T = 8;
  Batch batch = random_batch(4, T, config.vocab_size, 9);
  batch.targets[1] = 0;  // equal counts in both halves so the two means weigh alike

  Transformer big(config, nullptr), accumulated(config, nullptr);
  big.initialize(1);
  accumulated.initialize(1);
  big.parameters().zero_grads();
  accumulated.parameters().zero_grads();
  big.forward(ctx, batch.tokens.data(), batch.targets.data(), 4, T, 1.0f);
  big.backward(ctx);
  for (int half = 0; half < 2; ++half) {
    accumulated.forward(ctx, batch.tokens.data() + half * 2 * T,
                        batch.targets.data() + half * 2 * T, 2, T, 0.5f);
    accumulated.backward(ctx);
  }
  const auto& a = big.parameters();
  const auto& b = accumulated.parameters();
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < a.size(); ++i) {
    max_diff = std::fmax(max_diff, std::fabs(a.grads()[i] - b.grads()[i]));
    max_ref = std::fmax(max_ref, std::fabs(a.grads()[i]));
  }
  // Only the order of fp32 sums differs (per-row gradient scale and weight-gradient GEMM sums).
  EXPECT_LT(max_diff / max_ref, 1e-5);
}

// bf16: the LM head's backward run inside its forward (HeadFusion::always, one pass over row
// chunks) against the separate backward from the stored logits gradient (HeadFusion::never). The
// forward is the same chunked GEMM and cross-entropy, so the losses are bit-identical; the head's
// weight gradient is the same fp32 sum in another order (per chunk and lane instead of one GEMM)
// and d_normed comes from a chunk GEMM instead of the whole one (same sum order at the models'
// widths, not always at d_model 32: see MatmulBf16RowChunks), so every gradient agrees to fp32
// rounding carried through the backward (1e-5 of each parameter's largest gradient). 640 rows
// make three head chunks (256, 256 and a 128-row tail) over two lanes.
class HeadFusionParity : public ::testing::TestWithParam<Family> {};

namespace {

// Every parameter's gradient in `a` within `relative` of the largest of its gradient in `b`.
void expect_gradients_agree(const ParameterStore& a, const ParameterStore& b, double relative) {
  for (const auto& p : a.parameters()) {
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < p.numel; ++i) {
      const float x = a.grads()[p.offset + i], y = b.grads()[p.offset + i];
      max_diff = std::fmax(max_diff, std::fabs(static_cast<double>(x) - y));
      max_ref = std::fmax(max_ref, std::fabs(static_cast<double>(y)));
    }
    EXPECT_GT(max_ref, 0.0) << p.name;
    EXPECT_LE(max_diff, relative * max_ref) << p.name;
  }
}

}  // namespace

TEST_P(HeadFusionParity, Bf16HeadBackwardInsideTheForwardEqualsTheSeparateBackward) {
  const ModelConfig config = tiny(GetParam());
  ScopedOmpThreads two_threads(2);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::bf16, nullptr};
  const int64_t B = 20, T = 32;
  const Batch batch = random_batch(B, T, config.vocab_size, 13);
  Transformer fused(config, nullptr), separate(config, nullptr);
  fused.set_head_fusion(HeadFusion::always);
  separate.set_head_fusion(HeadFusion::never);
  for (Transformer* model : {&fused, &separate}) {
    model->initialize(3);
    model->parameters().zero_grads();
  }
  // Two micro-batches: the fused partials must add to what the first one left.
  for (float scale : {0.5f, 0.5f}) {
    const float fused_loss =
        fused.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, scale);
    const float separate_loss =
        separate.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, scale);
    EXPECT_EQ(fused_loss, separate_loss);
    fused.backward(ctx);
    separate.backward(ctx);
  }
  expect_gradients_agree(fused.parameters(), separate.parameters(), 1e-5);
}

// bf16: the head on the vocabulary-blocked kernel (HeadFusion::vocab_blocked, the default where it
// applies) against the separate backward from the stored logits gradient. Its softmax sums are
// formed block by block, so losses agree to fp32 rounding, and a value of the logits' gradient can
// round to the neighbouring bf16 where its fp32 value sits at a rounding boundary (2^-8 of that
// value); carried through the backward (the flips change d_normed, which reaches every layer),
// gradients agree to a bf16 rounding step (2^-8) of each parameter's largest (measured: up to
// 1.2e-3 on llama-tiny; GPT-2 tiny's single vocabulary block gives the same sums, all but the
// head's weight-gradient partials bit-identical).
TEST_P(HeadFusionParity, Bf16VocabBlockedHeadAgreesWithTheSeparateBackward) {
  constexpr double kBf16Step = 1.0 / 256.0;
  const ModelConfig config = tiny(GetParam());
  if (!kernels::MatmulEngine::vocab_blocked_head_applies(config.d_model))
    GTEST_SKIP() << "the vocabulary-blocked head needs AMX";
  ScopedOmpThreads two_threads(2);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::bf16, nullptr};
  const int64_t B = 20, T = 32;
  const Batch batch = random_batch(B, T, config.vocab_size, 13);
  Transformer blocked(config, nullptr), separate(config, nullptr);
  blocked.set_head_fusion(HeadFusion::vocab_blocked);
  separate.set_head_fusion(HeadFusion::never);
  for (Transformer* model : {&blocked, &separate}) {
    model->initialize(3);
    model->parameters().zero_grads();
  }
  for (float scale : {0.5f, 0.5f}) {
    const float blocked_loss =
        blocked.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, scale);
    const float separate_loss =
        separate.forward(ctx, batch.tokens.data(), batch.targets.data(), B, T, scale);
    EXPECT_NEAR(blocked_loss, separate_loss, 1e-6 * separate_loss);
    blocked.backward(ctx);
    separate.backward(ctx);
  }
  expect_gradients_agree(blocked.parameters(), separate.parameters(), kBf16Step);
}

INSTANTIATE_TEST_SUITE_P(Families, HeadFusionParity,
                         ::testing::Values(Family::gpt2, Family::llama));

TEST(Transformer, RefusesTokensOutsideTheVocabulary) {
  const ModelConfig config = model_preset("gpt2-tiny");
  Transformer model(config, nullptr);
  kernels::CpuOps ops;
  LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  std::vector<int32_t> tokens(8, 1), targets(8, 2);
  tokens[3] = static_cast<int32_t>(config.vocab_size);
  EXPECT_THROW(model.forward(ctx, tokens.data(), targets.data(), 1, 8, 1.0f), Error);
  tokens[3] = 0;
  targets[2] = 1000;
  EXPECT_THROW(model.forward(ctx, tokens.data(), targets.data(), 1, 8, 1.0f), Error);
}

TEST(StageRange, UntiedCopyOfATiedHeadStartsEqualToTheEmbedding) {
  const ModelConfig config = model_preset("gpt2-tiny");  // tied head
  Transformer first(config, nullptr, StageRange{0, 1});
  Transformer last(config, nullptr, StageRange{1, -1});
  first.initialize(3);
  last.initialize(3);
  const auto& a = first.parameters();
  const auto& b = last.parameters();
  const int wte = a.index_of("transformer.wte.weight"), head = b.index_of("lm_head.weight");
  ASSERT_EQ(a.info(wte).numel, b.info(head).numel);
  for (int64_t i = 0; i < a.info(wte).numel; ++i) ASSERT_EQ(a.value(wte)[i], b.value(head)[i]);
  // The blocks draw from their own names' streams whatever stage holds them.
  Transformer whole(config, nullptr);
  whole.initialize(3);
  const int w = whole.parameters().index_of("transformer.h.1.mlp.c_fc.weight");
  const int s = b.index_of("transformer.h.1.mlp.c_fc.weight");
  EXPECT_EQ(whole.parameters().value(w)[5], b.value(s)[5]);
}
