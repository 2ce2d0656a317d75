// Tensor-parallel blocks (issue #21): a model built with a tensor-parallel group of 2 or 4 local
// ranks, each holding its column and row slices (ParameterStore placements), with and without
// sequence parallelism (the residual stream on each rank's sequence rows), gives the loss and,
// slice by slice, the gradients of the whole model on one rank from the same initial weights and
// batch: GPT-2, Llama and DeepSeek's multi-head latent attention (its heads split, its latent
// projections and norms whole on every rank with their gradients summed over tp), with a query
// rank and without. The reference is that single-rank run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;
using kernels::Precision;

namespace {

constexpr int64_t kB = 9, kT = 32;  // 288 rows: the bf16 row-chunk paths (256 and a tail)

// The models under test: GPT-2, Llama, and DeepSeek-V3's multi-head latent attention (4 heads)
// with dense SwiGLU MLPs (the routed experts are whole on every tp rank: the parity CLI tests
// them), with a query rank (q_a_proj, q_a_layernorm, q_b_proj) and with q_proj.
enum class Model { gpt2, llama, deepseek, deepseek_q_proj };

bool latent(Model model) {
  return model == Model::deepseek || model == Model::deepseek_q_proj;
}

std::string model_name(Model model) {
  switch (model) {
    case Model::gpt2:
      return "gpt2";
    case Model::llama:
      return "llama";
    case Model::deepseek:
      return "deepseek";
    case Model::deepseek_q_proj:
      return "deepseek_q_proj";
  }
  return "";
}

ModelConfig tiny(Model model) {
  ModelConfig c = model_preset(model == Model::gpt2 ? "gpt2-tiny"
                               : latent(model)      ? "deepseek-v3-tiny"
                                                    : "llama-tiny");
  c.n_layers = 2;
  c.init_std = 0.2f;
  if (model == Model::llama) c.n_kv_heads = 4;  // tp 4 splits the key/value heads too
  if (latent(model)) {                          // dense MLPs
    c.n_experts = 1;
    c.top_k = 1;
    c.moe_shared_experts = 0;
    c.moe_first_dense_layers = 0;
  }
  if (model == Model::deepseek_q_proj) c.q_lora_rank = 0;
  // Not a multiple of tp x 64: the vocabulary slices are padded (GPT-2: 320 rows over tp 2 or 4,
  // the last slice partly padding; Llama and DeepSeek untied: their heads too).
  c.vocab_size = 300;
  if (model != Model::gpt2) c.tied_embeddings = false;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch batch(int64_t vocab) {
  Rng rng(23);
  Batch b;
  for (int64_t i = 0; i < kB * kT; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  return b;
}

struct StepResult {
  float loss = 0;
  std::vector<float> grads;  // the store's flat gradients
};

StepResult train_once(Transformer& model, Precision precision, const Batch& b) {
  kernels::CpuOps ops;
  const LayerContext ctx{ops, precision, nullptr};
  model.parameters().zero_grads();
  StepResult r;
  r.loss = model.forward(ctx, b.tokens.data(), b.targets.data(), kB, kT, 1.0f);
  model.backward(ctx);
  const ParameterStore& p = model.parameters();
  r.grads.assign(p.grads(), p.grads() + p.size());
  return r;
}

using Case = std::tuple<Model, Precision, int, bool>;  // ..., tp, sequence parallelism

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return model_name(std::get<0>(info.param)) + "_" +
         (std::get<1>(info.param) == Precision::bf16 ? "bf16" : "fp32") + "_tp" +
         std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_sp" : "");
}

// Both models from the same initial weights: a training step of each, fp32 then bf16, gives the
// same loss and gradients bit for bit.
void expect_bit_identical_steps(Transformer& a, Transformer& c, const Batch& b, int rank) {
  a.initialize(5);
  c.initialize(5);
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const StepResult x = train_once(a, precision, b);
    const StepResult y = train_once(c, precision, b);
    EXPECT_EQ(x.loss, y.loss);
    EXPECT_EQ(x.grads, y.grads) << "rank " << rank;
  }
}

TensorParallelGroup group_of(comm::Communicator& group, bool sequence_parallel) {
  TensorParallelGroup g{&group, group.rank(), group.size()};
  g.sequence_parallel = sequence_parallel;
  return g;
}

}  // namespace

class TensorParallelBlocks : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelBlocks, EachRanksSlicesMatchTheWholeModelsGradients) {
  const auto [model_kind, precision, tp, sp] = GetParam();
  const ModelConfig config = tiny(model_kind);
  const Batch b = batch(config.vocab_size);
  Transformer whole(config, nullptr);
  whole.initialize(5);
  const StepResult reference = train_once(whole, precision, b);
  const ParameterStore& all = whole.parameters();

  // Tolerances. fp32: the row-parallel layers' sums over their input split into tp partial sums
  // added by the all-reduce, so values differ from one rank's by fp32 rounding of a reordered sum
  // (about 1e-6 relative), which the backward carries: 1e-4 of each tensor's largest gradient.
  // bf16: the same reordering, and then an activation rounded to bf16 from a sum that differs in
  // its last fp32 bits can land on the neighbouring bf16 (2^-8 relative), so a tensor's gradient
  // is compared by its relative L2 distance, 2e-2. Sequence parallelism reorders more sums the same
  // way (reduce-scatters for all-reduces, the norms' weight gradients summed from each rank's rows)
  // and is held to the same bounds.
  const bool bf16 = precision == Precision::bf16;
  std::vector<int> sharded(static_cast<size_t>(tp), 0);
  comm::run_local_ranks(tp, [&](comm::Communicator& group) {
    const TensorParallelGroup g = group_of(group, sp);
    Transformer model(config, nullptr, {}, g);
    model.initialize(5);
    const StepResult run = train_once(model, precision, b);
    EXPECT_NEAR(run.loss, reference.loss, (bf16 ? 2e-3 : 1e-5) * std::abs(reference.loss));
    const ParameterStore& mine = model.parameters();
    ASSERT_EQ(mine.parameters().size(), all.parameters().size());
    for (const ParameterInfo& p : mine.parameters()) {
      const ParameterInfo& w = all.info(all.index_of(p.name));
      ASSERT_EQ(p.global_shape, w.shape) << p.name;
      if (!p.shard.whole()) ++sharded[static_cast<size_t>(group.rank())];
      // This slice of the whole model's gradient, element by element.
      const SliceWalk walk = slice_walk(p);
      double diff2 = 0, ref2 = 0, largest = 0, worst = 0;
      int64_t i = 0;
      for (int64_t o = 0; o < walk.outer; ++o)
        for (int64_t e = 0; e < walk.run; ++e, ++i) {
          const double want =
              reference.grads[static_cast<size_t>(w.offset + o * walk.stride + walk.first + e)];
          const double got = run.grads[static_cast<size_t>(p.offset + i)];
          diff2 += (got - want) * (got - want);
          ref2 += want * want;
          largest = std::max(largest, std::abs(want));
          worst = std::max(worst, std::abs(got - want));
        }
      // A padded vocabulary slice: its rows past the vocabulary are padding, with no gradient.
      ASSERT_EQ(i, walk.outer * walk.run);
      for (; i < p.numel; ++i)
        ASSERT_EQ(run.grads[static_cast<size_t>(p.offset + i)], 0.0f) << p.name << " padding";
      if (bf16)
        EXPECT_LE(std::sqrt(diff2), 2e-2 * std::sqrt(ref2) + 1e-7) << p.name;
      else
        EXPECT_LE(worst, 1e-4 * largest + 1e-7) << p.name;
    }
  });
  // Every block's matrices are split (4 per GPT-2 block plus c_attn's and c_fc's biases; 7 per
  // Llama block; DeepSeek's q_b_proj or q_proj, kv_b_proj, o_proj and its MLP's 3, while q_a_proj
  // and kv_a_proj_with_mqa stay whole), and so are the token embedding and an untied head by
  // vocabulary rows; the norms stay whole.
  const int per_block = model_kind == Model::llama ? 7 : 6;
  const int vocabulary = config.tied_embeddings ? 1 : 2;
  for (int n : sharded) EXPECT_EQ(n, per_block * config.n_layers + vocabulary);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelBlocks,
                         ::testing::Combine(::testing::Values(Model::gpt2, Model::llama,
                                                              Model::deepseek,
                                                              Model::deepseek_q_proj),
                                            ::testing::Values(Precision::fp32, Precision::bf16),
                                            ::testing::Values(2, 4), ::testing::Bool()),
                         case_name);

TEST(TensorParallelBlocks, RefusesATpThatDoesNotDivideTheHeads) {
  ModelConfig config = tiny(Model::llama);
  config.n_kv_heads = 2;
  comm::run_local_ranks(4, [&](comm::Communicator& group) {
    const TensorParallelGroup g{&group, group.rank(), group.size()};
    try {
      Transformer model(config, nullptr, {}, g);
      ADD_FAILURE() << "tp 4 over 2 key/value heads was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key/value heads"), std::string::npos) << e.what();
    }
  });
}

TEST(TensorParallelBlocks, ActivationCheckpointingUnderTensorParallelismIsBitIdentical) {
  // Full recomputation runs each block's forward again, all-reduces included, before its
  // backward; selective recomputes the attention on this rank's heads. Either way the same
  // arithmetic: bit for bit the gradients without checkpointing, on every tp rank, with sequence
  // parallelism (whose recomputed forward gathers and reduce-scatters again) and without.
  for (const auto mode : {Recompute::kFull, Recompute::kSelective})
    for (const bool sp : {false, true}) {
      const ModelConfig config = tiny(Model::gpt2);
      const Batch b = batch(config.vocab_size);
      comm::run_local_ranks(2, [&](comm::Communicator& group) {
        const TensorParallelGroup g = group_of(group, sp);
        Transformer plain(config, nullptr, {}, g), checkpointed(config, nullptr, {}, g);
        checkpointed.set_activation_checkpointing({mode, 1});
        expect_bit_identical_steps(plain, checkpointed, b, group.rank());
      });
    }
}

TEST(TensorParallelBlocks, OverlappedInputGradientReductionsAreBitIdenticalToBlockingOnes) {
  // The column-parallel layers' input-gradient all-reduces run while their weight gradients are
  // computed (TensorParallelGroup::overlap): the same operations in another order of independent
  // work, so the same bits as blocking all-reduces, for every family and precision. Under sequence
  // parallelism the overlapped collectives are the reduce-scatters of those gradients and the
  // all-gathers of the column layers' inputs (run while the input halves compute).
  for (const Model kind : {Model::gpt2, Model::llama, Model::deepseek})
    for (const bool sp : {false, true}) {
      const ModelConfig config = tiny(kind);
      const Batch b = batch(config.vocab_size);
      comm::run_local_ranks(2, [&](comm::Communicator& group) {
        TensorParallelGroup overlapped = group_of(group, sp);
        TensorParallelGroup blocking = overlapped;
        blocking.overlap = false;
        Transformer a(config, nullptr, {}, overlapped), c(config, nullptr, {}, blocking);
        expect_bit_identical_steps(a, c, b, group.rank());
      });
    }
}

TEST(TensorParallelBlocks, SplitBackwardUnderSequenceParallelismGivesTheWholeBackwardsBits) {
  // Zero-bubble schedules run a stage's backward as B (input gradients) and later W (weight
  // gradients); under sequence parallelism W gathers the column layers' inputs again. B then W
  // performs the whole backward's operations: the same bits, on every tp rank.
  for (const Model kind : {Model::gpt2, Model::llama, Model::deepseek, Model::deepseek_q_proj}) {
    const ModelConfig config = tiny(kind);
    const Batch b = batch(config.vocab_size);
    comm::run_local_ranks(2, [&](comm::Communicator& group) {
      const TensorParallelGroup g = group_of(group, true);
      Transformer model(config, nullptr, {}, g);
      model.initialize(5);
      kernels::CpuOps ops;
      for (Precision precision : {Precision::fp32, Precision::bf16}) {
        const LayerContext ctx{ops, precision, nullptr};
        const StepResult whole = train_once(model, precision, b);
        model.parameters().zero_grads();
        StageActivations acts = model.make_activations();
        const float loss = model.forward_stage(ctx, acts, b.tokens.data(), nullptr,
                                               b.targets.data(), kB, kT, 1.0f);
        model.backward_stage_input(ctx, acts, nullptr);
        model.backward_stage_weight(ctx, acts);
        const ParameterStore& p = model.parameters();
        EXPECT_EQ(loss, whole.loss);
        EXPECT_EQ(std::vector<float>(p.grads(), p.grads() + p.size()), whole.grads)
            << "rank " << group.rank();
      }
    });
  }
}

TEST(TensorParallelBlocks, RefusesSequenceParallelismWithoutTensorParallelism) {
  TensorParallelGroup one;
  one.sequence_parallel = true;
  try {
    Transformer model(tiny(Model::gpt2), nullptr, {}, one);
    ADD_FAILURE() << "sequence parallelism at tp = 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallelism.tp > 1"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelBlocks, RefusesSequenceRowsThatDoNotSplitOverTheGroup) {
  // 9 sequences of 3 tokens: 27 rows do not split over tp = 2.
  const ModelConfig config = tiny(Model::llama);
  comm::run_local_ranks(2, [&](comm::Communicator& group) {
    Transformer model(config, nullptr, {}, group_of(group, true));
    model.initialize(5);
    kernels::CpuOps ops;
    const LayerContext ctx{ops, Precision::fp32, nullptr};
    const Batch b = batch(config.vocab_size);
    try {
      model.forward(ctx, b.tokens.data(), b.targets.data(), 9, 3, 1.0f);
      ADD_FAILURE() << "27 rows over tp 2 were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("divisible by tp"), std::string::npos) << e.what();
    }
  });
}
