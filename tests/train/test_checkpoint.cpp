// Checkpoints record every parameter's placement (logical shape, shard, replicated axes) in the
// safetensors metadata of the weights and of the optimizer state, without changing the tensors;
// a checkpoint round-trips, one written before placements were recorded still loads, and one
// whose placements disagree with the model is refused with one line naming the parameter.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

class CheckpointPlacements : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice-checkpoint-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    config_ = model::model_preset("gpt2-tiny");
    config_.vocab_size = 256;
    config_.max_seq_len = 32;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves a checkpoint of an initialised model with made-up moments; returns its directory.
  std::string save(model::Transformer& model) {
    model.initialize(3);
    kernels::CpuOps adamw_ops;
    optim::AdamWOptimizer adamw(adamw_ops, model.parameters(), {}, nullptr);
    for (int64_t i = 0; i < model.parameters().size(); ++i) {
      adamw.exp_avg()[i] = 0.001f * static_cast<float>(i % 97);
      adamw.exp_avg_sq()[i] = 0.002f * static_cast<float>(i % 89);
    }
    adamw.set_steps_taken(7);
    return train::save_checkpoint(dir_.string(), model, adamw, {7, 70, 1}, "", 2);
  }

  // Rewrites `file` with its tensors unchanged and the metadata changed by `edit`.
  static void rewrite_metadata(
      const std::string& file,
      const std::function<void(std::map<std::string, std::string>&)>& edit) {
    std::vector<Tensor> tensors;
    std::vector<SafetensorsEntry> entries;
    std::map<std::string, std::string> metadata;
    {
      SafetensorsFile in(file);
      metadata = in.metadata();
      for (const std::string& name : in.names()) tensors.push_back(in.read(name));
      const std::vector<std::string> names = in.names();
      for (size_t i = 0; i < names.size(); ++i)
        entries.push_back(safetensors_entry(names[i], tensors[i]));
    }
    edit(metadata);
    write_safetensors(file, entries, metadata);
  }

  fs::path dir_;
  model::ModelConfig config_;
};

TEST_F(CheckpointPlacements, EveryParameterIsRecordedWholeAndReplicated) {
  model::Transformer model(config_, nullptr);
  const std::string checkpoint = save(model);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    SafetensorsFile stored((fs::path(checkpoint) / file).string());
    ASSERT_TRUE(stored.metadata().contains("lattice.placements")) << file;
    const auto placements = nlohmann::json::parse(stored.metadata().at("lattice.placements"));
    ASSERT_EQ(placements.size(), model.parameters().parameters().size()) << file;
    for (const auto& p : model.parameters().parameters()) {
      const auto& entry = placements.at(p.name);
      EXPECT_EQ(entry.at("global_shape").get<Shape>(), p.shape) << p.name;
      EXPECT_EQ(entry.at("shard").at("count").get<int>(), 1) << p.name;
      EXPECT_EQ(
          entry.at("replicated").get<std::vector<std::string>>(),
          (std::vector<std::string>{"pp", "dp", "cp", "tp", "ep", "dp_replicate", "dp_shard"}))
          << p.name;
    }
  }
  // The tensors are the model's values, unchanged by the metadata.
  SafetensorsFile weights((fs::path(checkpoint) / "model.safetensors").string());
  const auto& store = model.parameters();
  for (const auto& p : store.parameters()) {
    const SafetensorsEntry& e = weights.entry(p.name);
    ASSERT_EQ(e.nbytes, static_cast<size_t>(p.numel) * 4);
    EXPECT_EQ(0, std::memcmp(e.data, store.value(store.index_of(p.name)), e.nbytes)) << p.name;
  }
}

TEST_F(CheckpointPlacements, RoundTripsAndAcceptsCheckpointsWithoutPlacements) {
  model::Transformer model(config_, nullptr);
  const std::string checkpoint = save(model);
  // Drop the placements, as a checkpoint written before they were recorded.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    rewrite_metadata((fs::path(checkpoint) / file).string(),
                     [](auto& metadata) { metadata.erase("lattice.placements"); });
  model::Transformer loaded(config_, nullptr);
  kernels::CpuOps adamw_ops;
  optim::AdamWOptimizer adamw(adamw_ops, loaded.parameters(), {}, nullptr);
  const train::TrainerState state = train::load_checkpoint(checkpoint, loaded, &adamw);
  EXPECT_EQ(state.step, 7);
  EXPECT_EQ(adamw.steps_taken(), 7);
  EXPECT_EQ(0, std::memcmp(loaded.parameters().values(), model.parameters().values(),
                           static_cast<size_t>(model.parameters().size()) * 4));
  EXPECT_EQ(adamw.exp_avg()[96], 0.001f * 96);
}

TEST_F(CheckpointPlacements, DisagreeingPlacementsAreOneClearError) {
  model::Transformer model(config_, nullptr);
  const std::string checkpoint = save(model);
  const std::string name = "transformer.h.0.attn.c_attn.weight";
  auto error_after = [&](const std::function<void(nlohmann::json&)>& change) -> std::string {
    const std::string file = (fs::path(checkpoint) / "model.safetensors").string();
    rewrite_metadata(file, [&](auto& metadata) {
      auto placements = nlohmann::json::parse(metadata.at("lattice.placements"));
      change(placements.at(name));
      metadata["lattice.placements"] = placements.dump();
    });
    model::Transformer loaded(config_, nullptr);
    try {
      train::load_checkpoint(checkpoint, loaded, nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string sharded = error_after([](nlohmann::json& p) {
    p["shard"] = {{"dim", 0}, {"index", 1}, {"count", 2}};
  });
  EXPECT_NE(sharded.find("holds shard 1 of 2 (dimension 0) of '" + name +
                         "', this rank needs shard 0 of 1: resharding a checkpoint is not "
                         "supported yet"),
            std::string::npos)
      << sharded;
  const std::string reshaped = error_after([](nlohmann::json& p) {
    p["shard"] = {{"dim", 0}, {"index", 0}, {"count", 1}};
    p["global_shape"] = {1, 2};
  });
  EXPECT_NE(reshaped.find("holds '" + name + "' with logical shape [1, 2]"), std::string::npos)
      << reshaped;
  EXPECT_EQ(reshaped.find('\n'), std::string::npos);
}

}  // namespace
