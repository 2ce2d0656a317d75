// RoPE scaling in the model's settings: the model.rope_* keys set the ModelConfig's RopeScaling and
// read back from the TOML a run writes, the checkpoint's model JSON keeps it (and stays as it was
// for plain RoPE), and a scaling that cannot apply is refused with one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {
namespace {

TrainConfig llama31_tiny() {
  return load_train_config(
      "", {"model.preset=llama-tiny", "model.max_seq_len=64", "training.seq_len=64",
           "model.rope_theta=500000", "model.rope_type=llama3", "model.rope_factor=8",
           "model.rope_original_max_position_embeddings=16", "model.rope_high_freq_factor=2"});
}

TEST(RopeConfig, KeysSetTheScalingAndReadBackFromTheRunsToml) {
  const TrainConfig c = llama31_tiny();
  const kernels::RopeScaling& s = c.model.rope_scaling;
  EXPECT_EQ(s.type, kernels::RopeType::llama3);
  EXPECT_EQ(s.factor, 8.0);
  EXPECT_EQ(s.original_max_positions, 16);
  EXPECT_EQ(s.high_freq_factor, 2.0);
  EXPECT_EQ(s.low_freq_factor, 1.0);  // the default
  EXPECT_FALSE(s.attention_factor);
  const std::string toml = c.to_toml();
  EXPECT_NE(toml.find("rope_type = 'llama3'"), std::string::npos) << toml;
  EXPECT_EQ(toml.find("rope_attention_factor"), std::string::npos);  // unset: not written
  const auto path = std::filesystem::temp_directory_path() / "lattice_rope_config.toml";
  std::ofstream(path) << toml;
  const TrainConfig back = load_train_config(path.string(), {});
  std::filesystem::remove(path);
  EXPECT_TRUE(back.model.rope_scaling == s);
  const TrainConfig yarn = load_train_config(
      "", {"model.preset=llama-tiny", "training.seq_len=32", "model.rope_type=yarn",
           "model.rope_factor=4", "model.rope_original_max_position_embeddings=8",
           "model.rope_attention_factor=1.5", "model.rope_truncate=false"});
  EXPECT_EQ(*yarn.model.rope_scaling.attention_factor, 1.5);
  EXPECT_FALSE(yarn.model.rope_scaling.truncate);
}

TEST(RopeConfig, TheCheckpointsModelJsonKeepsIt) {
  const model::ModelConfig c = llama31_tiny().model;
  const model::ModelConfig back = model::model_config_from_json(model::model_config_to_json(c));
  EXPECT_TRUE(back.rope_scaling == c.rope_scaling);
  EXPECT_EQ(back.rope_theta, 500000.0f);
  model::ModelConfig yarn = c;
  yarn.rope_scaling.type = kernels::RopeType::yarn;
  yarn.rope_scaling.attention_factor = 1.25;
  yarn.rope_scaling.truncate = false;
  EXPECT_TRUE(model::model_config_from_json(model::model_config_to_json(yarn)).rope_scaling ==
              yarn.rope_scaling);
  // Plain RoPE writes nothing new: the metadata of existing checkpoints stays what it was.
  EXPECT_EQ(model::model_config_to_json(model::model_preset("llama-tiny")).find("rope_scaling"),
            std::string::npos);
}

TEST(RopeConfig, RefusesAScalingThatCannotApply) {
  const auto error_of = [](const std::vector<std::string>& overrides) -> std::string {
    try {
      load_train_config("", overrides).model.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"model.preset=gpt2-tiny", "model.rope_type=linear", "model.rope_factor=2"})
                .find("gpt2 models have learned positions, no RoPE"),
            std::string::npos);
  EXPECT_NE(error_of({"model.preset=llama-tiny", "model.rope_type=yarn", "model.rope_factor=4"})
                .find("set model.rope_original_max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(error_of({"model.preset=llama-tiny", "model.rope_type=longrope"})
                .find("unknown RoPE type 'longrope'"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice::train
