// Tests of activations as data, the split backward and activation checkpointing on whole models:
// forwards of several microbatches into their own activation sets followed by their backwards in
// another order; the stage's backward in input (B) and weight (W) halves, also interleaved across
// microbatches as a zero-bubble schedule runs them; full and selective recomputation. Each against
// the same work done the plain way (one microbatch's forward and backward after another): the
// arithmetic is the same, so losses and gradients must be equal bit for bit.
#include <gtest/gtest.h>
#include <algorithm>

#include <cstring>
#include <tuple>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/activation_pool.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;
using kernels::Precision;

namespace {

// Tiny models with 4 blocks (interval 2 then recomputes blocks 0 and 2): GPT-2, Llama and the two
// MoE presets (mixtral-tiny: every block MoE; deepseek-moe-tiny: blocks 1 and 3, with a shared
// expert). 9 x 32 = 288 rows take the bf16 row-chunk paths (256-row chunks and a tail).
ModelConfig four_block_tiny(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.n_layers = 4;
  c.init_std = 0.2f;
  return c;
}
constexpr int64_t kB = 9, kT = 32;

struct Microbatch {
  std::vector<int32_t> tokens, targets;
};

std::vector<Microbatch> microbatches(int count, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<Microbatch> out(static_cast<size_t>(count));
  for (auto& m : out) {
    for (int64_t i = 0; i < kB * kT; ++i) {
      m.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
      m.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    }
    m.targets[3] = -1;  // an ignored target
  }
  return out;
}

void expect_same_gradients(const Transformer& a, const Transformer& b) {
  const auto& pa = a.parameters();
  const auto& pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa.parameters()) {
    ASSERT_EQ(0, std::memcmp(pa.grads() + p.offset, pb.grads() + p.offset,
                             sizeof(float) * static_cast<size_t>(p.numel)))
        << p.name << " differs";
  }
  bool any_nonzero = false;
  for (int64_t i = 0; i < pa.size(); ++i) any_nonzero |= pa.grads()[i] != 0.0f;
  EXPECT_TRUE(any_nonzero);
}

using Case = std::tuple<std::string, Precision>;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = std::get<0>(info.param);
  std::replace(name.begin(), name.end(), '-', '_');
  return name + "_" + (std::get<1>(info.param) == Precision::bf16 ? "bf16" : "fp32");
}

const auto kPresets =
    ::testing::Values(std::string("gpt2-tiny"), std::string("llama-tiny"),
                      std::string("mixtral-tiny"), std::string("deepseek-moe-tiny"));

}  // namespace

class ActivationSets : public ::testing::TestWithParam<Case> {};

TEST_P(ActivationSets, FourForwardsThenBackwardsInAnotherOrderEqualOneAfterAnother) {
  const auto [preset, precision] = GetParam();
  const ModelConfig config = four_block_tiny(preset);
  kernels::CpuOps ops;
  const LayerContext ctx{ops, precision, nullptr};
  const auto batches = microbatches(4, config.vocab_size, 31);
  const int order[] = {2, 0, 3, 1};  // the backwards' order

  MemoryTracker tracker;
  Transformer in_flight(config, &tracker), sequential(config, nullptr);
  for (Transformer* m : {&in_flight, &sequential}) {
    m->initialize(7);
    m->parameters().zero_grads();
  }
  // Four forwards, each into its own set from the pool, before any backward.
  ActivationPool pool(in_flight);
  std::vector<StageActivations*> sets;
  std::vector<float> losses;
  for (const auto& m : batches) {
    sets.push_back(&pool.acquire());
    losses.push_back(in_flight.forward_stage(ctx, *sets.back(), m.tokens.data(), nullptr,
                                             m.targets.data(), kB, kT, 0.25f));
  }
  EXPECT_EQ(pool.in_use(), 4);
  const int64_t four_in_flight = tracker.current(MemoryCategory::activations);
  for (int m : order) {
    in_flight.backward_stage(ctx, *sets[static_cast<size_t>(m)], nullptr);
    pool.give_back(*sets[static_cast<size_t>(m)], /*free=*/true);
  }
  EXPECT_EQ(pool.in_use(), 0);
  // Four sets were alive at once: more than twice one set's bytes (each holds its residuals).
  EXPECT_GT(four_in_flight, 0);

  for (int m : order) {
    const auto& mb = batches[static_cast<size_t>(m)];
    const float loss = sequential.forward(ctx, mb.tokens.data(), mb.targets.data(), kB, kT, 0.25f);
    EXPECT_EQ(loss, losses[static_cast<size_t>(m)]) << "microbatch " << m;
    sequential.backward(ctx);
  }
  expect_same_gradients(in_flight, sequential);
}

TEST_P(ActivationSets, ASetFromAnotherStageOrABackwardWithoutForwardIsRefused) {
  const auto [preset, precision] = GetParam();
  const ModelConfig config = four_block_tiny(preset);
  kernels::CpuOps ops;
  const LayerContext ctx{ops, precision, nullptr};
  Transformer whole(config, nullptr), stage(config, nullptr, StageRange{0, 2});
  StageActivations foreign = stage.make_activations();
  const auto mb = microbatches(1, config.vocab_size, 3)[0];
  EXPECT_THROW(
      whole.forward_stage(ctx, foreign, mb.tokens.data(), nullptr, mb.targets.data(), kB, kT, 1.0f),
      Error);
  StageActivations fresh = whole.make_activations();
  EXPECT_THROW(whole.backward_stage(ctx, fresh, nullptr), Error);
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndPrecisions, ActivationSets,
                         ::testing::Combine(kPresets,
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         case_name);

class SplitBackward : public ::testing::TestWithParam<Case> {};

TEST_P(SplitBackward, InputThenWeightHalvesEqualTheWholeBackward) {
  // A last stage (blocks 1..3 and the head) fed a hidden input, so that d_hidden_in is compared
  // too, and a whole model (embedding's W). Zero-bubble order for two microbatches: F0 F1 B0 B1
  // W0 W1, against F0 B0 F1 B1 with whole backwards.
  const auto [preset, precision] = GetParam();
  ModelConfig config = four_block_tiny(preset);
  config.tied_embeddings = false;
  kernels::CpuOps ops;
  const LayerContext ctx{ops, precision, nullptr};
  const auto batches = microbatches(2, config.vocab_size, 41);
  Rng rng(5);
  std::vector<float> hidden(static_cast<size_t>(kB * kT * config.d_model));
  for (auto& x : hidden) x = rng.uniform() - 0.5f;

  for (StageRange range : {StageRange{1, -1}, StageRange{}}) {
    const bool first = range.first_block == 0;
    Transformer split(config, nullptr, range), whole(config, nullptr, range);
    for (Transformer* m : {&split, &whole}) {
      m->initialize(9);
      m->parameters().zero_grads();
    }
    auto forward = [&](Transformer& m, StageActivations& a, const Microbatch& mb) {
      return m.forward_stage(ctx, a, first ? mb.tokens.data() : nullptr,
                             first ? nullptr : hidden.data(), mb.targets.data(), kB, kT, 0.5f);
    };
    std::vector<StageActivations> sa, wa;
    for (int i = 0; i < 2; ++i) {
      sa.push_back(split.make_activations());
      wa.push_back(whole.make_activations());
    }
    for (int i = 0; i < 2; ++i) forward(split, sa[static_cast<size_t>(i)], batches[i]);
    for (auto& a : sa) split.backward_stage_input(ctx, a, nullptr);
    for (auto& a : sa) split.backward_stage_weight(ctx, a);
    for (int i = 0; i < 2; ++i) {
      forward(whole, wa[static_cast<size_t>(i)], batches[i]);
      whole.backward_stage(ctx, wa[static_cast<size_t>(i)], nullptr);
    }
    expect_same_gradients(split, whole);
    if (!first) {
      const size_t n = hidden.size();
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(0, std::memcmp(sa[static_cast<size_t>(i)].d_hidden_in(),
                                 wa[static_cast<size_t>(i)].d_hidden_in(), sizeof(float) * n));
    }
    // W without B, and a forward into a set whose W is pending, are refused.
    StageActivations fresh = split.make_activations();
    EXPECT_THROW(split.backward_stage_weight(ctx, fresh), Error);
    forward(split, fresh, batches[0]);
    split.backward_stage_input(ctx, fresh, nullptr);
    EXPECT_THROW(forward(split, fresh, batches[1]), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndPrecisions, SplitBackward,
                         ::testing::Combine(kPresets,
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         case_name);

class Checkpointing : public ::testing::TestWithParam<Case> {};

TEST_P(Checkpointing, FullAndSelectiveRecomputationAreBitIdenticalAndSaveMemory) {
  const auto [preset, precision] = GetParam();
  const ModelConfig config = four_block_tiny(preset);
  kernels::CpuOps ops;
  const auto batches = microbatches(2, config.vocab_size, 51);
  using Mode = Recompute;
  struct Run {
    ActivationCheckpoint checkpointing;
    bool split = false;
  };
  const Run runs[] = {{{Mode::kNone, 1}},       {{Mode::kFull, 1}},
                      {{Mode::kFull, 2}},       {{Mode::kSelective, 1}},
                      {{Mode::kFull, 1}, true}, {{Mode::kSelective, 1}, true}};
  std::vector<std::unique_ptr<Transformer>> models;
  std::vector<int64_t> peaks;
  std::vector<std::vector<float>> losses;
  for (const Run& run : runs) {
    MemoryTracker tracker;
    const LayerContext ctx{ops, precision, &tracker};
    auto model = std::make_unique<Transformer>(config, &tracker);
    model->set_activation_checkpointing(run.checkpointing);
    model->initialize(13);
    model->parameters().zero_grads();
    std::vector<float> run_losses;
    for (const auto& mb : batches) {
      StageActivations a = model->make_activations();
      run_losses.push_back(
          model->forward_stage(ctx, a, mb.tokens.data(), nullptr, mb.targets.data(), kB, kT, 0.5f));
      if (run.split) {
        model->backward_stage_input(ctx, a, nullptr);
        model->backward_stage_weight(ctx, a);
      } else {
        model->backward_stage(ctx, a, nullptr);
      }
    }
    peaks.push_back(tracker.peak(MemoryCategory::activations));
    losses.push_back(run_losses);
    models.push_back(std::move(model));
  }
  for (size_t r = 1; r < models.size(); ++r) {
    SCOPED_TRACE("run " + std::to_string(r));
    EXPECT_EQ(losses[r], losses[0]);
    expect_same_gradients(*models[r], *models[0]);
  }
  // Recomputation keeps fewer activations at the peak: full over every block least, full over
  // every other block between, selective drops only the attention outputs.
  EXPECT_LT(peaks[1], peaks[2]);
  EXPECT_LT(peaks[2], peaks[0]);
  EXPECT_LT(peaks[3], peaks[0]);
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndPrecisions, Checkpointing,
                         ::testing::Combine(kPresets,
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         case_name);

TEST(Checkpointing, AnIntervalBelowOneIsRefused) {
  Transformer model(four_block_tiny("gpt2-tiny"), nullptr);
  EXPECT_THROW(model.set_activation_checkpointing({Recompute::kFull, 0}), Error);
}
