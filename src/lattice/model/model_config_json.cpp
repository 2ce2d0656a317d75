// ModelConfig <-> JSON: see model_config_json.hpp.
#include "lattice/model/model_config_json.hpp"

#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"

namespace lattice::model {

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"family", family_name(c.family)},
                      {"vocab_size", c.vocab_size},
                      {"max_seq_len", c.max_seq_len},
                      {"d_model", c.d_model},
                      {"n_layers", c.n_layers},
                      {"n_heads", c.n_heads},
                      {"n_kv_heads", c.n_kv_heads},
                      {"ffn_hidden", c.ffn_hidden},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"tied_embeddings", c.tied_embeddings},
                      {"init_std", c.init_std}};
  // Written only when they differ from a dense model without dropout, so that the metadata of every
  // model the trainer builds stays what it was before these fields existed.
  if (c.n_experts != 1 || c.top_k != 1) {
    j["n_experts"] = c.n_experts;
    j["top_k"] = c.top_k;
    j["moe_layer_interval"] = c.moe_layer_interval;
    j["moe_ffn_hidden"] = c.moe_ffn_hidden;
    j["moe_shared_experts"] = c.moe_shared_experts;
    j["moe_score"] = router_score_name(c.moe_score);
    j["moe_normalize"] = c.moe_normalize;
    j["moe_scaling"] = c.moe_scaling;
    if (c.moe_capacity_factor) j["moe_capacity_factor"] = *c.moe_capacity_factor;
    j["moe_aux_loss_coef"] = c.moe_aux_loss_coef;
    j["moe_z_loss_coef"] = c.moe_z_loss_coef;
    if (c.moe_bias_update_rate != 0) j["moe_bias_update_rate"] = c.moe_bias_update_rate;
    if (c.moe_choice_bias) j["moe_choice_bias"] = true;
    if (c.moe_groups != 1) {
      j["moe_groups"] = c.moe_groups;
      j["moe_top_groups"] = c.moe_top_groups;
    }
    j["moe_names"] = moe_names_name(c.moe_names);
    if (c.moe_activation != MoeActivation::swiglu)
      j["moe_activation"] = moe_activation_name(c.moe_activation);
  }
  if (c.moe_first_dense_layers != 0) j["moe_first_dense_layers"] = c.moe_first_dense_layers;
  if (c.latent_attention() || c.q_lora_rank != 0 || c.qk_nope_head_dim != 0 ||
      c.qk_rope_head_dim != 0 || c.v_head_dim != 0) {
    j["q_lora_rank"] = c.q_lora_rank;
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
  }
  if (c.dropout != 0) j["dropout"] = c.dropout;
  if (c.explicit_head_dim != 0) j["head_dim"] = c.explicit_head_dim;
  if (c.sliding_window != 0) j["sliding_window"] = c.sliding_window;
  // Only a scaled RoPE is written, so that the metadata of plain-RoPE models stays as it was.
  if (c.rope_scaling.scaled()) {
    const kernels::RopeScaling& s = c.rope_scaling;
    nlohmann::json r = {{"type", kernels::rope_type_name(s.type)},
                        {"factor", s.factor},
                        {"original_max_positions", s.original_max_positions},
                        {"low_freq_factor", s.low_freq_factor},
                        {"high_freq_factor", s.high_freq_factor},
                        {"beta_fast", s.beta_fast},
                        {"beta_slow", s.beta_slow},
                        {"mscale", s.mscale},
                        {"mscale_all_dim", s.mscale_all_dim},
                        {"truncate", s.truncate}};
    if (s.attention_factor) r["attention_factor"] = *s.attention_factor;
    j["rope_scaling"] = r;
  }
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& json) {
  try {
    const auto j = nlohmann::json::parse(json);
    ModelConfig c;
    c.name = j.at("name").get<std::string>();
    c.family = parse_family(j.at("family").get<std::string>());
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.max_seq_len = j.at("max_seq_len").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.n_heads = j.at("n_heads").get<int64_t>();
    c.n_kv_heads = j.at("n_kv_heads").get<int64_t>();
    c.ffn_hidden = j.at("ffn_hidden").get<int64_t>();
    c.norm_eps = j.at("norm_eps").get<float>();
    c.rope_theta = j.at("rope_theta").get<float>();
    c.tied_embeddings = j.at("tied_embeddings").get<bool>();
    c.init_std = j.at("init_std").get<float>();
    c.n_experts = j.value("n_experts", int64_t{1});
    c.top_k = j.value("top_k", int64_t{1});
    c.moe_layer_interval = j.value("moe_layer_interval", int64_t{1});
    c.moe_ffn_hidden = j.value("moe_ffn_hidden", int64_t{0});
    c.moe_shared_experts = j.value("moe_shared_experts", int64_t{0});
    c.moe_score = parse_router_score(j.value("moe_score", std::string("softmax")));
    c.moe_normalize = j.value("moe_normalize", true);
    c.moe_scaling = j.value("moe_scaling", 1.0f);
    if (j.contains("moe_capacity_factor"))
      c.moe_capacity_factor = j.at("moe_capacity_factor").get<double>();
    c.moe_aux_loss_coef = j.value("moe_aux_loss_coef", 0.0);
    c.moe_z_loss_coef = j.value("moe_z_loss_coef", 0.0);
    c.moe_bias_update_rate = j.value("moe_bias_update_rate", 0.0);
    c.moe_choice_bias = j.value("moe_choice_bias", false);
    c.moe_groups = j.value("moe_groups", int64_t{1});
    c.moe_top_groups = j.value("moe_top_groups", int64_t{1});
    c.moe_names = parse_moe_names(j.value("moe_names", std::string("mixtral")));
    c.moe_activation = parse_moe_activation(j.value("moe_activation", std::string("swiglu")));
    c.moe_first_dense_layers = j.value("moe_first_dense_layers", int64_t{0});
    c.q_lora_rank = j.value("q_lora_rank", int64_t{0});
    c.kv_lora_rank = j.value("kv_lora_rank", int64_t{0});
    c.qk_nope_head_dim = j.value("qk_nope_head_dim", int64_t{0});
    c.qk_rope_head_dim = j.value("qk_rope_head_dim", int64_t{0});
    c.v_head_dim = j.value("v_head_dim", int64_t{0});
    c.dropout = j.value("dropout", 0.0f);
    c.explicit_head_dim = j.value("head_dim", int64_t{0});
    c.sliding_window = j.value("sliding_window", int64_t{0});
    if (j.contains("rope_scaling")) {
      const auto& r = j.at("rope_scaling");
      kernels::RopeScaling& s = c.rope_scaling;
      s.type = kernels::parse_rope_type(r.at("type").get<std::string>());
      s.factor = r.at("factor").get<double>();
      s.original_max_positions = r.at("original_max_positions").get<int64_t>();
      s.low_freq_factor = r.at("low_freq_factor").get<double>();
      s.high_freq_factor = r.at("high_freq_factor").get<double>();
      s.beta_fast = r.at("beta_fast").get<double>();
      s.beta_slow = r.at("beta_slow").get<double>();
      s.mscale = r.at("mscale").get<double>();
      s.mscale_all_dim = r.at("mscale_all_dim").get<double>();
      s.truncate = r.at("truncate").get<bool>();
      if (r.contains("attention_factor"))
        s.attention_factor = r.at("attention_factor").get<double>();
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("model configuration JSON is damaged: ") + e.what());
  }
}

}  // namespace lattice::model
