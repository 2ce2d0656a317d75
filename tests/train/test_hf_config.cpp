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
  EXPECT_EQ(a.head_dim(), b.head_dim());
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.expert_ffn_hidden(), b.expert_ffn_hidden());
  EXPECT_EQ(a.moe_normalize, b.moe_normalize);
  EXPECT_EQ(a.moe_names, b.moe_names);
  EXPECT_EQ(a.moe_first_dense_layers, b.moe_first_dense_layers);
  EXPECT_EQ(a.moe_shared_experts, b.moe_shared_experts);
  EXPECT_EQ(a.moe_score, b.moe_score);
  EXPECT_EQ(a.moe_scaling, b.moe_scaling);
  EXPECT_EQ(a.moe_groups, b.moe_groups);
  EXPECT_EQ(a.moe_top_groups, b.moe_top_groups);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
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
       {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "mixtral-tiny", "qwen2.5-0.5b", "qwen2.5-7b",
        "qwen3-tiny", "mistral-tiny", "qwen3-moe-tiny", "llama3.1-8b", "llama3.2-1b", "llama3.2-3b",
        "mistral-7b", "qwen3-8b", "qwen3-30b-a3b", "deepseek-v3"}) {
    SCOPED_TRACE(preset);
    const model::ModelConfig c = model::model_preset(preset);
    expect_same_model(model_config_from_hf(hf_config_json(c), "config.json"), c);
  }
  // A DeepSeek-V3 trained without the choice bias is read back with one (transformers' router
  // always has it; the export writes zeros): one parameter per expert and MoE layer more.
  const model::ModelConfig tiny = model::model_preset("deepseek-v3-tiny");
  model::ModelConfig read = model_config_from_hf(hf_config_json(tiny), "config.json");
  EXPECT_TRUE(read.moe_choice_bias);
  EXPECT_EQ(read.parameter_count(), tiny.parameter_count() + tiny.moe_layers() * tiny.n_experts);
  read.moe_choice_bias = false;
  expect_same_model(read, tiny);
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

// The config.json files of published models (their Hugging Face repositories' config.json, keys and
// values as released) read as Lattice's presets of them.
TEST(HfConfig, PublishedConfigsReadAsThePresets) {
  const std::pair<const char*, const char*> published[] = {
      {"llama3.2-1b", R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
        "use_cache": true, "vocab_size": 128256})"},
      {"mistral-7b", R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
        "use_cache": true, "vocab_size": 32000})"},
      {"qwen2.5-7b", R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
        "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
        "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 152064})"},
      {"qwen3-8b", R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
        "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936})"},
      {"qwen3-30b-a3b", R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
        "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
        "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 151936})"},
      // DeepSeek-V3's, less auto_map and quantization_config (its FP8 weights; a BF16 conversion
      // saved by transformers has neither; both are refused below).
      {"deepseek-v3", R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
        "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
        "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "model_type": "deepseek_v3",
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32,
        "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
        "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
        "v_head_dim": 128, "vocab_size": 129280})"}};
  for (const auto& [preset, config] : published) {
    SCOPED_TRACE(preset);
    model::ModelConfig expected = model::model_preset(preset);
    const model::ModelConfig read = model_config_from_hf(config, "config.json");
    expected.norm_eps = read.norm_eps;  // the presets leave eps at the family's default
    expect_same_model(read, expected);
  }
  // DeepSeek-V3 as released: FP8 weights and its own modeling code, one line each; its
  // sequence-wise balance loss is reported, not applied.
  json released = json::parse(published[5].second);
  std::vector<std::string> ignored;
  model_config_from_hf(released.dump(), "config.json", &ignored);
  ASSERT_EQ(ignored.size(), 1u);
  EXPECT_NE(ignored[0].find("aux_loss_alpha = 0.001 (DeepSeek's sequence-wise balance loss)"),
            std::string::npos)
      << ignored[0];
  released["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}};
  EXPECT_NE(error_of(released.dump()).find("the weights are quantized"), std::string::npos);
  released.erase("quantization_config");
  released["auto_map"] = {{"AutoModelForCausalLM", "modeling_deepseek.DeepseekV3ForCausalLM"}};
  EXPECT_NE(error_of(released.dump()).find("trust_remote_code"), std::string::npos);
}

TEST(HfConfig, EveryKeyIsReadOrKnownToLeaveTheArithmeticAlone) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "qwen3-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(preset);
    json j = json::parse(hf_config_json(model::model_preset(preset)));
    // Bookkeeping and generation defaults pass; an unknown key is named.
    j["_name_or_path"] = "somewhere";
    j["temperature"] = 0.7;
    EXPECT_EQ(error_of(j.dump()), "");
    j["attn_logit_softcapping"] = 50.0;  // Gemma 2's: it would change every score
    const std::string error = error_of(j.dump());
    EXPECT_NE(error.find("\"attn_logit_softcapping\" (50.0) is not a key Lattice reads"),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find('\n'), std::string::npos);
  }
  json llama = json::parse(hf_config_json(model::model_preset("llama-tiny")));
  llama["quantization_config"] = json::object({{"quant_method", "gptq"}});
  EXPECT_NE(error_of(llama.dump()).find("the weights are quantized"), std::string::npos);
  llama.erase("quantization_config");
  llama["auto_map"] = json::object({{"AutoModelForCausalLM", "modeling.Model"}});
  EXPECT_NE(error_of(llama.dump()).find("trust_remote_code"), std::string::npos);
  // Dropout is read and reported, not applied.
  json gpt2 = json::parse(hf_config_json(model::model_preset("gpt2-tiny")));
  gpt2["resid_pdrop"] = 0.1;
  gpt2["scale_attn_by_inverse_layer_idx"] = false;
  std::vector<std::string> ignored;
  model_config_from_hf(gpt2.dump(), "config.json", &ignored);
  ASSERT_EQ(ignored.size(), 1u);
  EXPECT_NE(ignored[0].find("resid_pdrop = 0.1 is not applied"), std::string::npos) << ignored[0];
  gpt2["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_NE(error_of(gpt2.dump()).find("scale_attn_by_inverse_layer_idx is set"),
            std::string::npos);
}

TEST(HfConfig, NewFamiliesAreWrittenAsTheirOwnTypes) {
  const json qwen3 = json::parse(hf_config_json(model::model_preset("qwen3-tiny")));
  EXPECT_EQ(qwen3.at("model_type"), "qwen3");
  EXPECT_EQ(qwen3.at("head_dim"), 16);  // 4 heads of 16 on a 32-wide model
  const json moe = json::parse(hf_config_json(model::model_preset("qwen3-moe-tiny")));
  EXPECT_EQ(moe.at("architectures")[0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(moe.at("num_experts"), 8);
  EXPECT_EQ(moe.at("num_local_experts"), 8);
  EXPECT_EQ(moe.at("moe_intermediate_size"), 16);
  const json mistral = json::parse(hf_config_json(model::model_preset("mistral-tiny")));
  EXPECT_EQ(mistral.at("model_type"), "mistral");
  EXPECT_EQ(mistral.at("sliding_window"), 8);
  // A Llama with a window has no Llama config to say so.
  model::ModelConfig windowed = model::model_preset("llama-tiny");
  windowed.sliding_window = 8;
  EXPECT_THROW(hf_config_json(windowed), Error);
  // DeepSeek-V3: transformers' rotary width is the rope channels', the rope rows interleaved (as
  // the export writes them), its MoE keys; no multi-token-prediction layers.
  const json deepseek = json::parse(hf_config_json(model::model_preset("deepseek-v3-tiny")));
  EXPECT_EQ(deepseek.at("architectures")[0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(deepseek.at("head_dim"), 8);
  EXPECT_EQ(deepseek.at("q_lora_rank"), 16);
  EXPECT_EQ(deepseek.at("rope_interleave"), true);
  EXPECT_EQ(deepseek.at("first_k_dense_replace"), 1);
  EXPECT_EQ(deepseek.at("n_routed_experts"), 8);
  EXPECT_EQ(deepseek.at("moe_intermediate_size"), 16);
  EXPECT_EQ(deepseek.at("intermediate_size"), 64);
  EXPECT_EQ(deepseek.at("num_nextn_predict_layers"), 0);
  // Its yarn keeps mscale_all_dim, which the softmax scale reads.
  const json v3 = json::parse(hf_config_json(model::model_preset("deepseek-v3")));
  EXPECT_EQ(v3.at("rope_scaling").at("mscale_all_dim"), 1.0);
  EXPECT_EQ(v3.at("n_group"), 8);
  EXPECT_EQ(v3.at("topk_group"), 4);
  // What deepseek_v3 cannot express, and DeepSeek's router in another family's type.
  model::ModelConfig softmax = model::model_preset("deepseek-v3-tiny");
  softmax.moe_score = kernels::RouterScore::softmax;
  EXPECT_THROW(hf_config_json(softmax), Error);
  model::ModelConfig grouped = model::model_preset("qwen3-moe-tiny");
  grouped.moe_groups = 2;
  EXPECT_THROW(hf_config_json(grouped), Error);
  model::ModelConfig dropping = model::model_preset("mixtral-tiny");
  dropping.moe_capacity_factor = 1.25;
  EXPECT_THROW(hf_config_json(dropping), Error);
}

TEST(HfConfig, RefusesWhatTheNewFamiliesCannotCompute) {
  json qwen3 = json::parse(hf_config_json(model::model_preset("qwen3-tiny")));
  qwen3.erase("head_dim");
  EXPECT_NE(error_of(qwen3.dump()).find("without head_dim"), std::string::npos);
  json moe = json::parse(hf_config_json(model::model_preset("qwen3-moe-tiny")));
  moe["mlp_only_layers"] = json::array({0});
  EXPECT_NE(error_of(moe.dump()).find("mlp_only_layers [0]"), std::string::npos);
  json qwen = json::parse(hf_config_json(model::model_preset("qwen3-tiny")));
  qwen["layer_types"] = json::array({"sliding_attention", "full_attention"});
  qwen["sliding_window"] = 8;
  EXPECT_NE(error_of(qwen.dump()).find("layer_types has \"sliding_attention\""), std::string::npos)
      << error_of(qwen.dump());
  // Mistral's window below the context is read; one as long as the context is none.
  json mistral = json::parse(hf_config_json(model::model_preset("mistral-tiny")));
  EXPECT_EQ(model_config_from_hf(mistral.dump(), "config.json").sliding_window, 8);
  mistral["sliding_window"] = 32;
  EXPECT_EQ(model_config_from_hf(mistral.dump(), "config.json").sliding_window, 0);
  // DeepSeek-V3: another router, key/value heads of their own, a window, no shared expert.
  const json deepseek = json::parse(hf_config_json(model::model_preset("deepseek-v3-tiny")));
  EXPECT_EQ(error_of(deepseek.dump()), "");
  const std::pair<std::pair<const char*, json>, const char*> refused[] = {
      {{"topk_method", "greedy"}, "topk_method \"greedy\" is not DeepSeek-V3's noaux_tc"},
      {{"scoring_func", "softmax"}, "scoring_func \"softmax\" is not DeepSeek-V3's sigmoid"},
      {{"num_key_value_heads", 2}, "num_key_value_heads differs from num_attention_heads"},
      {{"sliding_window", 8}, "\"sliding_window\" (8) is not a key Lattice reads"},
      {{"n_shared_experts", 0}, "always has a shared expert"},
      {{"attention_bias", true}, "attention_bias is set"}};
  for (const auto& [change, needle] : refused) {
    json j = deepseek;
    j[change.first] = change.second;
    const std::string error = error_of(j.dump());
    EXPECT_NE(error.find(needle), std::string::npos) << change.first << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace lattice::train
