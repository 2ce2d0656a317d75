// The one layout type and validator (parallel::ParallelLayout, validate_layout) as the planner uses
// them, the one preset table seen from both sides, and activation checkpointing with a block
// interval in the memory estimate.
#include <gtest/gtest.h>

#include <string>

#include "lattice/core/error.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/plan/memory_estimate.hpp"

namespace lattice::plan {
namespace {

std::string refusal(const ModelSpec& model, const ParallelLayout& layout) {
  try {
    validate_layout(model, layout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every preset the planner offers is the trainer's, field for field, trained at its max_seq_len.
TEST(OnePresetTable, PlannerPresetsAreTheTrainersPresets) {
  ASSERT_GE(model::model_presets().size(), 30u);
  for (const model::ModelConfig& preset : model::model_presets()) {
    SCOPED_TRACE(preset.name);
    const ModelSpec spec = model_preset(preset.name);
    const model::ModelConfig& base = spec;
    EXPECT_EQ(base.family, preset.family);
    EXPECT_EQ(base.n_layers, preset.n_layers);
    EXPECT_EQ(base.d_model, preset.d_model);
    EXPECT_EQ(base.n_heads, preset.n_heads);
    EXPECT_EQ(base.n_kv_heads, preset.n_kv_heads);
    EXPECT_EQ(base.ffn_hidden, preset.ffn_hidden);
    EXPECT_EQ(base.vocab_size, preset.vocab_size);
    EXPECT_EQ(base.tied_embeddings, preset.tied_embeddings);
    EXPECT_EQ(base.n_experts, preset.n_experts);
    EXPECT_EQ(base.dropout, preset.dropout);
    EXPECT_EQ(spec.seq_len, preset.max_seq_len);
    EXPECT_NO_THROW(validate(spec));
  }
  // The trainer's test models and the published ones are in the same table.
  EXPECT_NO_THROW(model_preset("gpt2-tiny"));
  EXPECT_NO_THROW(model::model_preset("megatron-1t"));
  // The published GPT tables train with dropout; the models this trainer trains have none.
  EXPECT_TRUE(model_preset("korthikanti-175b").has_dropout());
  EXPECT_FALSE(model_preset("gpt2-124m").has_dropout());
}

TEST(OneLayoutValidator, AcceptsWorldsOfDpTpPpCp) {
  const ModelSpec llama = model_preset("llama3-8b");  // 32 heads, 8 KV heads, 32 layers, s = 8192
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4})
      for (int cp : {1, 2}) {
        ParallelLayout l;
        l.dp = 2;
        l.tp = tp;
        l.pp = pp;
        l.cp = cp;
        l.global_batch_size = 8;
        EXPECT_EQ(refusal(llama, l), "") << l.describe();
        EXPECT_EQ(l.world_size(), 2 * tp * pp * cp);
        EXPECT_EQ(l.mesh_shape().world(), l.world_size());
      }
}

TEST(OneLayoutValidator, RefusesWithTheKeyToChange) {
  const ModelSpec gpt = model_preset("gpt2-124m");  // 12 heads, 12 layers, s = 1024
  ParallelLayout l;
  l.global_batch_size = 8;
  auto with = [&](auto change) {
    ParallelLayout changed = l;
    change(changed);
    return refusal(gpt, changed);
  };
  EXPECT_NE(with([](ParallelLayout& x) {
              x.tp = 5;
            }).find("parallelism.tp = 5 does not divide the 12 attention heads"),
            std::string::npos);
  // Layer counts the stages do not divide split unevenly; fewer layers than stages cannot.
  EXPECT_NE(with([](ParallelLayout& x) { x.pp = 13; }).find("need at least one block each"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) {
              x.cp = 3;
            }).find("training.seq_len = 1024 cannot be split over parallelism.cp = 3 ranks"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) {
              x.zero_stage = 4;
            }).find("parallelism.zero = 4 is not a ZeRO stage"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) {
              x.dp = 4;
              x.zero_stage = 1;
              x.hsdp_shard_size = 3;
            }).find("parallelism.hsdp_shard_size = 3 must divide parallelism.dp = 4"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) {
              x.dp = 4;
              x.hsdp_shard_size = 2;
            }).find("needs a ZeRO stage"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) { x.dp = 3; }).find("is not divisible by micro_batch_size"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) { x.ep = 2; }).find("parallelism.ep = 2"),
            std::string::npos);
  EXPECT_NE(with([](ParallelLayout& x) {
              x.recompute_interval = 2;
            }).find("applies to mode = \"full\" only"),
            std::string::npos);
  EXPECT_NE(
      with([](ParallelLayout& x) { x.tp = 0; }).find("parallelism.tp = 0 is not a parallel degree"),
      std::string::npos);
  ModelSpec bad = gpt;
  bad.n_heads = 7;
  EXPECT_NE(refusal(bad, l).find("not divisible by model.n_heads"), std::string::npos);
}

// Of the blocks [first, first + count), those whose index is a multiple of the interval.
TEST(ActivationCheckpoint, CountsTheRecomputedBlocksOfARange) {
  for (int64_t interval : {1, 2, 3, 5}) {
    model::ActivationCheckpoint full{model::Recompute::kFull, interval};
    for (int64_t first = 0; first < 12; ++first)
      for (int64_t count = 0; count < 12; ++count) {
        int64_t naive = 0;
        for (int64_t layer = first; layer < first + count; ++layer)
          naive += full.recomputes_block(layer) ? 1 : 0;
        EXPECT_EQ(full.full_blocks_in(first, count), naive)
            << interval << " " << first << " " << count;
      }
  }
  const model::ActivationCheckpoint selective{model::Recompute::kSelective, 1};
  EXPECT_EQ(selective.full_blocks_in(0, 10), 0);
  EXPECT_EQ((model::ActivationCheckpoint{model::Recompute::kFull, 2}.describe()),
            "full every 2nd block");
  EXPECT_THROW(model::parse_recompute("partial"), Error);
}

// Full recomputation of every k-th block: those blocks keep only their input, the others keep
// everything, on the stage that holds them.
TEST(MemoryEstimate, FullRecomputeIntervalMixesRecomputedAndKeptBlocks) {
  const ModelSpec m = model_preset("megatron-7.5b");  // 36 layers
  ParallelLayout none;
  none.global_batch_size = 1;
  ParallelLayout full = none;
  full.recompute = Recompute::kFull;
  const double kept = activation_bytes_per_layer(m, none);
  const double input_only = activation_bytes_per_layer(m, full);
  ASSERT_LT(input_only, kept);
  ParallelLayout every_third = full;
  every_third.recompute_interval = 3;  // blocks 0, 3, ..., 33: 12 of 36
  const double no_layers = estimate_memory(m, none).stages[0].activation_bytes - 36 * kept;
  EXPECT_NEAR(estimate_memory(m, every_third).stages[0].activation_bytes,
              no_layers + 12 * input_only + 24 * kept, 1e-6 * 36 * kept);
  // Interval 1 is plain full recomputation.
  ParallelLayout every_block = full;
  every_block.recompute_interval = 1;
  EXPECT_EQ(estimate_memory(m, every_block).stages[0].activation_bytes,
            estimate_memory(m, full).stages[0].activation_bytes);
  // Pipeline stages of 9 layers with interval 4: stage 0 holds blocks 0, 4, 8; stage 1 (9-17)
  // 12, 16; stage 2 (18-26) 20, 24; stage 3 (27-35) 28, 32. 1F1B keeps p - stage microbatches.
  ParallelLayout piped = full;
  piped.pp = 4;
  piped.global_batch_size = 8;
  piped.recompute_interval = 4;
  const MemoryEstimate estimate = estimate_memory(m, piped);
  ParallelLayout piped_none = piped;
  piped_none.recompute = Recompute::kNone;
  piped_none.recompute_interval = 1;
  const double kept_piped = activation_bytes_per_layer(m, piped_none);
  const double input_piped = activation_bytes_per_layer(m, piped);
  const int recomputed[] = {3, 2, 2, 2};
  for (int stage = 1; stage < 4; ++stage) {  // stage 0 also holds the embedding's dropout mask
    const double expected =
        (4 - stage) * (recomputed[stage] * input_piped + (9 - recomputed[stage]) * kept_piped);
    EXPECT_NEAR(estimate.stages[stage].activation_bytes / expected, 1.0, 1e-12) << stage;
  }
}

}  // namespace
}  // namespace lattice::plan
