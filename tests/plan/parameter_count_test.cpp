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
  size_t whole = 0, dense_trunk_only = 0, built = 0;
  for (const model::ModelConfig& preset : model::model_presets()) {
    SCOPED_TRACE(preset.name);
    const ParameterCount planned = count_parameters(planning_model(preset));
    if (!preset.is_moe()) {
      const int64_t store = model::Transformer::parameter_count(preset);
      EXPECT_EQ(planned.total, store);
      EXPECT_EQ(preset.parameter_count(), store);  // the trainer's closed form (6N) agrees too
      if (store < kBuildForRealBelow) {
        const model::Transformer built_model(preset, nullptr);
        EXPECT_EQ(built_model.parameters().size(), store);
        ++built;
      }
      ++whole;
      continue;
    }
    // Mixture of experts: the trainer builds no experts yet (its config refuses model.n_experts >
    // 1 until the expert-parallelism issue), so the ParameterStore can only be checked on the dense
    // trunk: the same model with one expert and no router. The experts and the router are then
    // checked against the planner's own decomposition, not against a store.
    std::printf(
        "%s: mixture of experts, not built by the trainer yet; checked its dense trunk "
        "(one expert, no router) against the ParameterStore\n",
        preset.name.c_str());
    model::ModelConfig dense = preset;
    dense.n_experts = 1;
    dense.top_k = 1;
    const ParameterCount trunk = count_parameters(planning_model(dense));
    EXPECT_EQ(trunk.total, model::Transformer::parameter_count(dense));
    const int64_t one_mlp = trunk.per_layer_experts;
    const int64_t router = preset.d_model * preset.n_experts;
    EXPECT_EQ(planned.total,
              trunk.total + preset.n_layers * ((preset.n_experts - 1) * one_mlp + router));
    ++dense_trunk_only;
  }
  EXPECT_EQ(whole + dense_trunk_only, model::model_presets().size());
  EXPECT_GE(whole, 30u);
  EXPECT_GE(built, 5u);             // gpt2-tiny, gpt2-small-test, gpt2-demo, llama-tiny, ...
  EXPECT_EQ(dense_trunk_only, 1u);  // mixtral-8x7b
}

}  // namespace
}  // namespace lattice::plan
