// The Hugging Face config.json mapping (train/hf_config.hpp) without transformers: what export
// writes reads back as the same model (every RoPE scaling type too), transformers 5.x's
// rope_parameters reads as 4.x's rope_theta and rope_scaling, and what Lattice cannot express is
// refused with one line. The files themselves are checked in transformers by test_hf_cli.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/train/hf_config.hpp"

namespace lattice::train {
namespace {

using nlohmann::json;

void expect_same_model(const model::ModelConfig& a, const model::ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.ffn_hidden, b.ffn_hidden);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_TRUE(a.rope_scaling == b.rope_scaling);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.parameter_count(), b.parameter_count());
}

std::string error_of(const std::string& config_json) {
  try {
    model_config_from_hf(config_json, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, ExportedConfigsReadBackAsTheSameModel) {
  for (const char* preset :
       {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "mixtral-tiny", "qwen2.5-0.5b", "qwen2.5-7b"}) {
    SCOPED_TRACE(preset);
    const model::ModelConfig c = model::model_preset(preset);
    expect_same_model(model_config_from_hf(hf_config_json(c), "config.json"), c);
  }
}

TEST(HfConfig, Qwen2IsWrittenAsItsOwnModelType) {
  const json j = json::parse(hf_config_json(model::model_preset("qwen2.5-0.5b")));
  EXPECT_EQ(j.at("model_type"), "qwen2");
  EXPECT_EQ(j.at("architectures")[0], "Qwen2ForCausalLM");
  EXPECT_EQ(j.at("use_sliding_window"), false);
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
  EXPECT_EQ(j.at("rope_theta"), 1000000.0);
  EXPECT_FALSE(j.contains("attention_bias"));  // Qwen 2's q/k/v biases come with its type
}

TEST(HfConfig, ReadsRopeThetaFromTransformers5sRopeParameters) {
  json j = json::parse(hf_config_json(model::model_preset("qwen2-tiny")));
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  EXPECT_EQ(model_config_from_hf(j.dump(), "config.json").rope_theta, 250000.0f);
  j["rope_parameters"]["rope_type"] = "longrope";
  EXPECT_NE(error_of(j.dump()).find("rope_parameters.rope_type \"longrope\" is a RoPE that "
                                    "Lattice does not compute"),
            std::string::npos)
      << error_of(j.dump());
}

// A Llama 3.1-style config as transformers 4.x writes it (rope_scaling with "type" or "rope_type",
// rope_theta at the top) and as 5.x writes it (everything in rope_parameters).
json llama31(bool v5) {
  json j = json::parse(hf_config_json(model::model_preset("llama-tiny")));
  const json scaling = {{"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 16}};
  if (v5) {
    j.erase("rope_theta");
    j["rope_parameters"] = scaling;
    j["rope_parameters"]["rope_type"] = "llama3";
    j["rope_parameters"]["rope_theta"] = 500000.0;
  } else {
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = scaling;
    j["rope_scaling"]["type"] = "llama3";
  }
  return j;
}

TEST(HfConfig, ReadsLlama3ScalingFromBothConfigFormats) {
  for (bool v5 : {false, true}) {
    SCOPED_TRACE(v5 ? "rope_parameters" : "rope_scaling");
    const model::ModelConfig c = model_config_from_hf(llama31(v5).dump(), "config.json");
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_EQ(c.rope_scaling.type, kernels::RopeType::llama3);
    EXPECT_EQ(c.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
    EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_scaling.original_max_positions, 16);
    EXPECT_EQ(c.max_seq_len, 32);
    // What export writes: rope_theta on top and rope_scaling with rope_type, which both read.
    const json out = json::parse(hf_config_json(c));
    EXPECT_EQ(out.at("rope_theta"), 500000.0);
    EXPECT_EQ(out.at("rope_scaling").at("rope_type"), "llama3");
    EXPECT_EQ(out.at("max_position_embeddings"), 32);
  }
}

TEST(HfConfig, EveryScalingTypeReadsBackAsTheSameModel) {
  model::ModelConfig c = model::model_preset("llama-tiny");
  c.max_seq_len = 64;
  c.rope_theta = 500000.0f;
  for (kernels::RopeType type : {kernels::RopeType::linear, kernels::RopeType::dynamic,
                                 kernels::RopeType::llama3, kernels::RopeType::yarn}) {
    SCOPED_TRACE(kernels::rope_type_name(type));
    c.rope_scaling = {};
    c.rope_scaling.type = type;
    c.rope_scaling.factor = 4;
    if (type != kernels::RopeType::linear) c.rope_scaling.original_max_positions = 16;
    if (type == kernels::RopeType::yarn) {
      c.rope_scaling.beta_fast = 16;
      c.rope_scaling.attention_factor = 1.25;
    }
    const json out = json::parse(hf_config_json(c));
    // dynamic and yarn: transformers 4.46 takes their base length from max_position_embeddings.
    const bool original = type == kernels::RopeType::dynamic || type == kernels::RopeType::yarn;
    EXPECT_EQ(out.at("max_position_embeddings"), original ? 16 : 64);
    expect_same_model(model_config_from_hf(out.dump(), "config.json"), c);
  }
  // yarn's attention factor from mscale is written resolved (4.46 has no mscale).
  c.rope_scaling.attention_factor.reset();
  c.rope_scaling.mscale = 0.707;
  c.rope_scaling.mscale_all_dim = 1;
  const json out = json::parse(hf_config_json(c));
  EXPECT_NEAR(out.at("rope_scaling").at("attention_factor").get<double>(),
              (0.0707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1), 1e-12);
}

TEST(HfConfig, RefusesRopeFieldsLatticeDoesNotCompute) {
  json j = llama31(true);
  j["rope_parameters"]["beta_fast"] = 32;  // a yarn field in a llama3 RoPE
  EXPECT_NE(error_of(j.dump()).find("rope_parameters.beta_fast is not a parameter of rope_type "
                                    "llama3 that Lattice computes"),
            std::string::npos)
      << error_of(j.dump());
  j = llama31(false);
  j["rope_scaling"].erase("factor");
  EXPECT_NE(error_of(j.dump()).find("rope_scaling of type llama3 has no factor"), std::string::npos)
      << error_of(j.dump());
  j = llama31(true);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(error_of(j.dump()).find("rope_scaling and rope_parameters differ"), std::string::npos)
      << error_of(j.dump());
  j = llama31(true);
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_NE(error_of(j.dump()).find("partial_rotary_factor 0.5 rotates part of each head"),
            std::string::npos)
      << error_of(j.dump());
}

TEST(HfConfig, RefusesWhatTheBlocksCannotCompute) {
  json llama = json::parse(hf_config_json(model::model_preset("llama-tiny")));
  llama["attention_bias"] = true;
  EXPECT_NE(error_of(llama.dump()).find("a Llama with q/k/v biases is model_type \"qwen2\""),
            std::string::npos)
      << error_of(llama.dump());
  json qwen = json::parse(hf_config_json(model::model_preset("qwen2-tiny")));
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 16;  // below max_position_embeddings (32)
  EXPECT_NE(error_of(qwen.dump()).find("use_sliding_window is set"), std::string::npos)
      << error_of(qwen.dump());
  qwen["sliding_window"] = 32;  // a window as long as the context is no window
  EXPECT_EQ(error_of(qwen.dump()), "");
}

}  // namespace
}  // namespace lattice::train
