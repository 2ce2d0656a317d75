// One description: for every preset of the one table, the planner's parameter count (its own
// closed form, plan::count_parameters) equals what the trainer's ParameterStore holds for the same
// model. Transformer::parameter_count declares the trainer's parameters without allocating them, so
// the 405B and 1T presets cost nothing; the small presets are also built for real and their
// ParameterStore measured.
#include <gtest/gtest.h>

#include <cstdio>

#include "lattice/model/model_config.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {
namespace {

// Small enough to allocate in a test (values and gradients, a few MB).
constexpr int64_t kBuildForRealBelow = 20'000'000;

TEST(OneDescription, PlannerCountEqualsTheParameterStoreForEveryPreset) {
  size_t whole = 0, moe = 0, built = 0;
  for (const model::ModelConfig& preset : model::model_presets()) {
    SCOPED_TRACE(preset.name);
    const ParameterCount planned = count_parameters(planning_model(preset));
    const int64_t store = model::Transformer::parameter_count(preset);
    EXPECT_EQ(planned.total, store);
    EXPECT_EQ(preset.parameter_count(), store);  // the trainer's closed form (6N) agrees too
    EXPECT_EQ(planned.active, preset.active_parameter_count());
    if (store < kBuildForRealBelow) {
      const model::Transformer built_model(preset, nullptr);
      EXPECT_EQ(built_model.parameters().size(), store);
      ++built;
    }
    if (!preset.is_moe()) {
      EXPECT_EQ(planned.active, planned.total);
      ++whole;
      continue;
    }
    // A MoE model: a token skips n_experts - top_k routed experts in each MoE layer.
    EXPECT_LT(planned.active, planned.total);
    ++moe;
  }
  EXPECT_GE(whole, 30u);
  EXPECT_GE(built,
            7u);  // gpt2-tiny, gpt2-small-test, gpt2-demo, llama-tiny, the MoE tiny ones, ...
  // mixtral-tiny, deepseek-moe-tiny, qwen3-moe-tiny, deepseek-v3-tiny, qwen3-30b-a3b,
  // mixtral-8x7b, deepseek-v3
  EXPECT_EQ(moe, 7u);
}

// GELU experts (two matrices each) beside SwiGLU shared experts and dense layers: the planner's
// count, the closed form and the store agree.
TEST(OneDescription, GeluExpertsAreCountedAlike) {
  model::ModelConfig config = model::model_preset("deepseek-moe-tiny");
  config.moe_activation = model::MoeActivation::gelu;
  const ParameterCount planned = count_parameters(planning_model(config));
  const int64_t store = model::Transformer::parameter_count(config);
  EXPECT_EQ(planned.total, store);
  EXPECT_EQ(config.parameter_count(), store);
  EXPECT_EQ(planned.active, config.active_parameter_count());
  const model::ModelConfig swiglu = model::model_preset("deepseek-moe-tiny");
  // One matrix fewer per routed expert: 8 experts of 16 x 32 in the one MoE layer.
  EXPECT_EQ(model::Transformer::parameter_count(swiglu) - store, 8 * 16 * 32);
}

}  // namespace
}  // namespace lattice::plan
