// DeepSeek-V3 <-> transformers' deepseek_v3: see hf_deepseek.hpp.
#include "lattice/train/hf_deepseek.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/kernels/rope_scaling.hpp"

namespace lattice::train {

using nlohmann::json;

namespace {

int64_t required_int(const json& j, const char* key, const std::string& source) {
  check(j.contains(key) && j.at(key).is_number_integer(),
        source + " has no integer \"" + std::string(key) + "\": it is not a complete config.json");
  return j.at(key).get<int64_t>();
}

// An integer that may be null (q_lora_rank, n_group, topk_group): `fallback` when null or absent.
int64_t nullable_int(const json& j, const char* key, int64_t fallback) {
  return j.contains(key) && !j.at(key).is_null() ? j.at(key).get<int64_t>() : fallback;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Permutes `count` rows of `cols` floats starting at `rows`: Lattice's row j is the interleaved
// row pair_of(j) = 2j (first half) or 2(j - count/2) + 1 (second half).
void permute_rows(float* rows, int64_t count, int64_t cols, bool to_interleaved) {
  std::vector<float> copy(rows, rows + count * cols);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t interleaved = j < count / 2 ? 2 * j : 2 * (j - count / 2) + 1;
    const int64_t from = to_interleaved ? j : interleaved, to = to_interleaved ? interleaved : j;
    std::copy_n(copy.data() + from * cols, cols, rows + to * cols);
  }
}

}  // namespace

void read_hf_deepseek_v3(const json& j, const std::string& source, model::ModelConfig& c,
                         std::vector<std::string>* ignored) {
  c.family = model::Family::deepseek;
  c.moe_names = model::MoeNames::deepseek;
  c.vocab_size = required_int(j, "vocab_size", source);
  c.d_model = required_int(j, "hidden_size", source);
  c.ffn_hidden = required_int(j, "intermediate_size", source);
  c.n_layers = required_int(j, "num_hidden_layers", source);
  c.n_heads = required_int(j, "num_attention_heads", source);
  c.n_kv_heads = c.n_heads;
  check(nullable_int(j, "num_key_value_heads", c.n_heads) == c.n_heads,
        source +
            ": num_key_value_heads differs from num_attention_heads; DeepSeek's latent "
            "attention expands one key/value head per query head (transformers fails on "
            "it too): set it to num_attention_heads");
  c.max_seq_len = required_int(j, "max_position_embeddings", source);
  c.norm_eps = j.value("rms_norm_eps", 1e-6f);
  c.tied_embeddings = j.value("tie_word_embeddings", false);
  const std::string act = j.value("hidden_act", std::string("silu"));
  check(act == "silu",
        source + ": hidden_act \"" + act + "\" is not SiLU, the gate of Lattice's SwiGLU MLPs");
  check(!j.value("attention_bias", false),
        source + ": attention_bias is set; Lattice's latent attention has no biases");
  // Multi-head latent attention (q_lora_rank null: one q_proj).
  c.q_lora_rank = nullable_int(j, "q_lora_rank", 0);
  c.kv_lora_rank = required_int(j, "kv_lora_rank", source);
  c.qk_nope_head_dim = required_int(j, "qk_nope_head_dim", source);
  c.qk_rope_head_dim = required_int(j, "qk_rope_head_dim", source);
  c.v_head_dim = required_int(j, "v_head_dim", source);
  // DeepSeek's remote-code configs name the router; only the one transformers computes is read.
  check(j.value("topk_method", std::string("noaux_tc")) == "noaux_tc",
        source + ": topk_method \"" + j.value("topk_method", std::string()) +
            "\" is not DeepSeek-V3's noaux_tc (group-limited top-k with the choice bias), the "
            "routing transformers' deepseek_v3 and Lattice compute");
  check(j.value("scoring_func", std::string("sigmoid")) == "sigmoid",
        source + ": scoring_func \"" + j.value("scoring_func", std::string()) +
            "\" is not DeepSeek-V3's sigmoid");
  check(nullable_int(j, "moe_layer_freq", 1) == 1,
        source +
            ": moe_layer_freq > 1 is not a layout transformers' deepseek_v3 builds (every "
            "layer after first_k_dense_replace is a MoE layer)");
  if (ignored != nullptr && j.value("aux_loss_alpha", 0.0) != 0)
    ignored->push_back("aux_loss_alpha = " + j.at("aux_loss_alpha").dump() +
                       " (DeepSeek's sequence-wise balance loss) is not applied: set "
                       "model.moe_aux_loss_coef for Lattice's batch-wise one");
  // The MoE: every layer from first_k_dense_replace on (none when that is every layer).
  const int64_t experts = j.contains("n_routed_experts")
                              ? required_int(j, "n_routed_experts", source)
                              : required_int(j, "num_local_experts", source);
  const int64_t dense = required_int(j, "first_k_dense_replace", source);
  check(dense >= 0, source + ": first_k_dense_replace must not be negative");
  if (dense >= c.n_layers || experts <= 1) return;  // a dense model
  c.n_experts = experts;
  c.moe_first_dense_layers = dense;
  c.top_k = required_int(j, "num_experts_per_tok", source);
  c.moe_ffn_hidden = required_int(j, "moe_intermediate_size", source);
  c.moe_shared_experts = required_int(j, "n_shared_experts", source);
  check(c.moe_shared_experts >= 1,
        source + ": n_shared_experts " + std::to_string(c.moe_shared_experts) +
            ": transformers' deepseek_v3 always has a shared expert; set it to 1 or more");
  c.moe_score = kernels::RouterScore::sigmoid;
  c.moe_normalize = j.value("norm_topk_prob", true);
  c.moe_scaling = j.value("routed_scaling_factor", 1.0f);
  c.moe_groups = nullable_int(j, "n_group", 1);
  c.moe_top_groups = nullable_int(j, "topk_group", 1);
  // transformers' router always adds e_score_correction_bias: held as it was trained.
  c.moe_choice_bias = true;
}

void check_deepseek_v3_exportable(const model::ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    throw Error("Hugging Face export: " + what +
                " has no equivalent in transformers' deepseek_v3; train with settings that do, "
                "or export the Lattice checkpoint as it is");
  };
  if (!c.latent_attention()) refuse("a deepseek-family model without latent attention");
  if (!c.is_moe()) return;
  if (c.moe_names != model::MoeNames::deepseek) refuse("Mixtral's MoE names (model.moe_names)");
  if (c.moe_score != kernels::RouterScore::sigmoid) refuse("a softmax router");
  if (c.moe_activation != model::MoeActivation::swiglu) refuse("GELU experts");
  if (c.moe_layer_interval != 1) refuse("MoE in every k-th layer only (k > 1)");
  if (c.moe_shared_experts < 1) refuse("a MoE without a shared expert");
}

void write_hf_deepseek_v3(const model::ModelConfig& c, json& j) {
  const bool moe = c.is_moe();
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["head_dim"] = c.qk_rope_head_dim;  // transformers' rotary width for this type
  j["rope_interleave"] = true;         // DeepSeek's layout; the export reorders the rope rows
  j["attention_bias"] = false;
  j["num_nextn_predict_layers"] = 0;
  // transformers 5 reads yarn's pre-training length from rope_scaling: the context is the
  // model's (hf_config writes the original for transformers 4.46, which has no deepseek_v3).
  j["max_position_embeddings"] = c.max_seq_len;
  // A dense model is one whose every layer is below first_k_dense_replace.
  j["first_k_dense_replace"] = moe ? c.moe_first_dense_layers : c.n_layers;
  j["n_routed_experts"] = moe ? c.n_experts : 2;
  j["num_experts_per_tok"] = moe ? c.top_k : 1;
  j["moe_intermediate_size"] = moe ? c.expert_ffn_hidden() : c.ffn_hidden;
  j["n_shared_experts"] = moe ? c.moe_shared_experts : 1;
  j["routed_scaling_factor"] = moe ? c.moe_scaling : 1.0f;
  j["norm_topk_prob"] = moe ? c.moe_normalize : true;
  j["n_group"] = moe ? c.moe_groups : 1;
  j["topk_group"] = moe ? c.moe_top_groups : 1;
  // Yarn's mscale keys: the softmax scale reads mscale_all_dim, and transformers 5 derives the
  // cos/sin factor from them as Lattice does (written resolved only when the model sets it).
  const kernels::RopeScaling& s = c.rope_scaling;
  if (s.type == kernels::RopeType::yarn && j.contains("rope_scaling")) {
    if (s.mscale != 0) j["rope_scaling"]["mscale"] = s.mscale;
    if (s.mscale_all_dim != 0) j["rope_scaling"]["mscale_all_dim"] = s.mscale_all_dim;
    if (!s.attention_factor) j["rope_scaling"].erase("attention_factor");
  }
}

bool HfWeightLayout::is_prediction_weight(const std::string& name) const {
  const std::string prefix = "model.layers.";
  if (prediction_layers <= 0 || name.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t end = name.find('.', prefix.size());
  if (end == std::string::npos) return false;
  const std::string index = name.substr(prefix.size(), end - prefix.size());
  const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  if (index.empty() || index.size() > 9 || !std::all_of(index.begin(), index.end(), digit))
    return false;
  const int64_t layer = std::stoll(index);
  return layer >= n_layers && layer < n_layers + prediction_layers;
}

HfWeightLayout hf_weight_layout(const json& config) {
  HfWeightLayout layout;
  if (config.value("model_type", std::string()) != "deepseek_v3") return layout;
  layout.interleaved_rope = config.value("rope_interleave", true);
  layout.n_layers = nullable_int(config, "num_hidden_layers", 0);
  layout.prediction_layers = std::max(nullable_int(config, "num_nextn_predict_layers", 0),
                                      nullable_int(config, "num_mtp_layers", 0));
  return layout;
}

void reorder_rope_rows(const model::ModelConfig& config, const std::string& name, float* values,
                       int64_t cols, bool to_interleaved) {
  if (!config.latent_attention()) return;
  const int64_t nope = config.qk_nope_head_dim, rope = config.qk_rope_head_dim;
  if (ends_with(name, ".self_attn.q_b_proj.weight") ||
      ends_with(name, ".self_attn.q_proj.weight")) {
    const int64_t qk = nope + rope;
    for (int64_t h = 0; h < config.n_heads; ++h)
      permute_rows(values + (h * qk + nope) * cols, rope, cols, to_interleaved);
  } else if (ends_with(name, ".self_attn.kv_a_proj_with_mqa.weight")) {
    permute_rows(values + config.kv_lora_rank * cols, rope, cols, to_interleaved);
  }
}

std::vector<std::pair<std::string, Shape>> hf_zero_tensors(const model::ModelConfig& config) {
  std::vector<std::pair<std::string, Shape>> zeros;
  if (config.family != model::Family::deepseek || !config.is_moe() || config.has_choice_bias())
    return zeros;
  for (int64_t layer = 0; layer < config.n_layers; ++layer)
    if (config.is_moe_layer(layer))
      zeros.emplace_back(
          "model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias",
          Shape{config.n_experts});
  return zeros;
}

}  // namespace lattice::train
