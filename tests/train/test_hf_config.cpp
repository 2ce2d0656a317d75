// The Hugging Face config.json mapping (train/hf_format.hpp) without transformers: what export
// writes reads back as the same model, transformers 5.x's rope_parameters reads as 4.x's
// rope_theta, and what Lattice cannot express is refused with one line. The files themselves are
// checked in transformers by test_hf_cli.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/train/hf_format.hpp"

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
  j["rope_parameters"]["rope_type"] = "llama3";
  EXPECT_NE(error_of(j.dump()).find("rope_type \"llama3\" scales RoPE"), std::string::npos);
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
