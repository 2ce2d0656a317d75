// Hugging Face config.json <-> ModelConfig: see hf_config.hpp.
#include "lattice/train/hf_config.hpp"

#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/hf_config_keys.hpp"
#include "lattice/train/hf_deepseek.hpp"

namespace lattice::train {

using nlohmann::json;

namespace {

// Refuses a model `transformers` cannot express as the model type we write.
void check_exportable(const model::ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    throw Error(
        "Hugging Face export: " + what +
        " has no transformers equivalent among gpt2, llama, mistral, qwen2, qwen3, mixtral, "
        "qwen3_moe and deepseek_v3; train with settings that do, or export the Lattice "
        "checkpoint as it is");
  };
  using model::Family;
  // transformers' routers are dropless: a capacity that drops copies computes another model.
  if (c.is_moe() && c.moe_capacity_factor)
    refuse("a MoE with a capacity factor (model.moe_capacity_factor drops tokens)");
  if (c.family == Family::deepseek) return check_deepseek_v3_exportable(c);
  if (c.moe_groups != 1 || c.moe_choice_bias) refuse("DeepSeek-V3's router (groups, choice bias)");
  if (c.family == Family::gpt2 && c.n_kv_heads != c.n_heads)
    refuse("GPT-2 with grouped-query attention (n_kv_heads < n_heads)");
  // A sliding window is saved by Mistral's and Mixtral's types only (Qwen 2's applies it to some
  // layers only).
  if (c.sliding_window > 0 && c.family != Family::mistral &&
      !(c.is_moe() && c.family == Family::llama))
    refuse("a " + model::family_name(c.family) +
           " model with a sliding window (set model.family = \"mistral\": the same block)");
  if (!c.is_moe()) return;
  if (c.family == Family::qwen3) {  // Qwen3-MoE: deepseek names, no shared experts
    if (c.moe_names != model::MoeNames::deepseek) refuse("a Qwen 3 MoE with Mixtral's names");
  } else if (c.family != Family::llama && c.family != Family::mistral) {
    refuse("a " + model::family_name(c.family) + " MoE");
  } else if (c.moe_names != model::MoeNames::mixtral) {
    refuse("a DeepSeek-style MoE (model.moe_names)");
  }
  if (c.moe_activation != model::MoeActivation::swiglu) refuse("GELU experts");
  if (c.moe_layer_interval != 1) refuse("MoE in every k-th layer only (k > 1)");
  if (c.moe_shared_experts > 0) refuse("shared experts");
  // Mixtral renormalises the chosen weights; Qwen3-MoE as norm_topk_prob says.
  if (c.moe_score != kernels::RouterScore::softmax || c.moe_scaling != 1.0f ||
      (!c.moe_normalize && c.family != Family::qwen3))
    refuse("a router other than softmax top-k with renormalised weights");
  if (c.moe_bias_update_rate > 0) refuse("the auxiliary-loss-free choice bias");
}

// A float as the shortest decimal that reads back as the same float (1e-05, not the double
// 9.999999747378752e-06 it widens to).
json float_json(float value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return json::parse(std::string(text, result.ptr));
}

// RoPE's base and scaling into `c` (whose max_seq_len is set): transformers 4.x writes rope_theta
// at the top level and the scaling as rope_scaling ({"type" or "rope_type", "factor", ...}), 5.x
// both inside rope_parameters. Read as transformers 5 reads them; a type or a field Lattice cannot
// express is refused, never dropped.
void read_hf_rope(const json& j, const std::string& source, model::ModelConfig& c) {
  const bool v5 = j.contains("rope_parameters") && j.at("rope_parameters").is_object();
  const bool v4 = j.contains("rope_scaling") && j.at("rope_scaling").is_object();
  // transformers 5 lets a legacy rope_scaling replace rope_parameters; two that differ are refused.
  check(!v5 || !v4 || j.at("rope_scaling") == j.at("rope_parameters"),
        source + ": rope_scaling and rope_parameters differ; keep one of them");
  const std::string field = v5 ? "rope_parameters" : "rope_scaling";
  const json rope = v5 ? j.at("rope_parameters") : v4 ? j.at("rope_scaling") : json::object();
  c.rope_theta = rope.contains("rope_theta") && !rope.at("rope_theta").is_null()
                     ? rope.at("rope_theta").get<float>()
                     : j.value("rope_theta", 10000.0f);
  const std::string type = rope.contains("rope_type") ? rope.at("rope_type").get<std::string>()
                           : rope.contains("type")    ? rope.at("type").get<std::string>()
                                                      : "default";
  const std::set<std::string> known = {"default", "linear", "dynamic", "llama3", "yarn"};
  check(known.count(type), source + ": " + field + ".rope_type \"" + type +
                               "\" is a RoPE that Lattice does not compute (it reads default, "
                               "linear, dynamic, llama3 and yarn): convert the model or drop it");
  kernels::RopeScaling& s = c.rope_scaling;
  s = {};
  s.type = kernels::parse_rope_type(type);
  // The fields each type reads (transformers' _validate_*_rope_parameters); any other is refused.
  std::set<std::string> fields = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  const std::map<std::string, std::vector<std::string>> by_type = {
      {"default", {}},
      {"linear", {"factor"}},
      // transformers' dynamic ignores original_max_position_embeddings (it grows beyond
      // max_position_embeddings); so does Lattice.
      {"dynamic", {"factor", "original_max_position_embeddings"}},
      {"llama3",
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
        "mscale", "mscale_all_dim", "truncate"}}};
  for (const std::string& f : by_type.at(type)) fields.insert(f);
  for (const auto& [key, value] : rope.items())
    check(fields.count(key), source + ": " + field + "." + key +
                                 " is not a parameter of rope_type " + type +
                                 " that Lattice computes: remove it or convert the model");
  if (rope.contains("partial_rotary_factor") || j.contains("partial_rotary_factor")) {
    const json& prf = rope.contains("partial_rotary_factor") ? rope.at("partial_rotary_factor")
                                                             : j.at("partial_rotary_factor");
    check(prf.is_null() || prf.get<double>() == 1.0,
          source + ": partial_rotary_factor " + prf.dump() +
              " rotates part of each head; Lattice's RoPE rotates all of it");
  }
  const auto number = [&](const char* key, double fallback) {
    return rope.contains(key) && !rope.at(key).is_null() ? rope.at(key).get<double>() : fallback;
  };
  // transformers 5 takes the pre-training length from a top-level original_max_position_embeddings
  // first (Phi 3), then rope_parameters, then max_position_embeddings.
  const auto original = [&]() -> int64_t {
    if (j.contains("original_max_position_embeddings") &&
        j.at("original_max_position_embeddings").is_number_integer())
      return j.at("original_max_position_embeddings").get<int64_t>();
    if (rope.contains("original_max_position_embeddings") &&
        !rope.at("original_max_position_embeddings").is_null())
      return rope.at("original_max_position_embeddings").get<int64_t>();
    return c.max_seq_len;
  };
  const auto extended = [&](double factor, int64_t base) {
    return std::max(c.max_seq_len, static_cast<int64_t>(std::llround(factor * base)));
  };
  switch (s.type) {
    case kernels::RopeType::plain:
      break;
    case kernels::RopeType::linear:
      check(rope.contains("factor"), source + ": " + field + " of type linear has no factor");
      s.factor = number("factor", 1.0);
      break;
    case kernels::RopeType::dynamic:
      // The base grows beyond max_position_embeddings; Lattice computes it for max_seq_len, which
      // becomes the length the factor extends it to.
      check(rope.contains("factor"), source + ": " + field + " of type dynamic has no factor");
      s.factor = number("factor", 1.0);
      s.original_max_positions = c.max_seq_len;
      c.max_seq_len = extended(s.factor, c.max_seq_len);
      break;
    case kernels::RopeType::llama3:
      for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
        check(rope.contains(key), source + ": " + field + " of type llama3 has no " + key);
      s.factor = number("factor", 1.0);
      s.low_freq_factor = number("low_freq_factor", 1.0);
      s.high_freq_factor = number("high_freq_factor", 4.0);
      s.original_max_positions = original();
      break;
    case kernels::RopeType::yarn: {
      s.original_max_positions = original();
      // transformers 5: an unset factor is max_position_embeddings / original.
      s.factor = number("factor", static_cast<double>(c.max_seq_len) /
                                      static_cast<double>(s.original_max_positions));
      if (rope.contains("attention_factor") && !rope.at("attention_factor").is_null())
        s.attention_factor = rope.at("attention_factor").get<double>();
      // transformers: beta_fast or 32, beta_slow or 1 (a 0 or null means the default).
      s.beta_fast = number("beta_fast", 0) != 0 ? number("beta_fast", 0) : 32.0;
      s.beta_slow = number("beta_slow", 0) != 0 ? number("beta_slow", 0) : 1.0;
      s.mscale = number("mscale", 0);
      s.mscale_all_dim = number("mscale_all_dim", 0);
      s.truncate = rope.contains("truncate") && !rope.at("truncate").is_null()
                       ? rope.at("truncate").get<bool>()
                       : true;
      c.max_seq_len = extended(s.factor, s.original_max_positions);
      break;
    }
  }
}

// The RoPE keys of an exported config.json: the top-level rope_theta (4.x; 5.x moves it into
// rope_parameters) and, when scaled, rope_scaling with rope_type (both read it: 5.x as its
// rope_parameters). yarn and dynamic take their base length from max_position_embeddings in
// transformers 4.46, so it is the original context there; yarn's attention factor is written
// resolved, since 4.46 has no mscale.
void write_hf_rope(const model::ModelConfig& c, json& j) {
  j["rope_theta"] = float_json(c.rope_theta);
  const kernels::RopeScaling& s = c.rope_scaling;
  if (!s.scaled()) return;
  json r = {{"rope_type", kernels::rope_type_name(s.type)}, {"factor", s.factor}};
  switch (s.type) {
    case kernels::RopeType::plain:
    case kernels::RopeType::linear:
      break;
    case kernels::RopeType::dynamic:
      j["max_position_embeddings"] = s.original_max_positions;
      break;
    case kernels::RopeType::llama3:
      r["low_freq_factor"] = s.low_freq_factor;
      r["high_freq_factor"] = s.high_freq_factor;
      r["original_max_position_embeddings"] = s.original_max_positions;
      break;
    case kernels::RopeType::yarn:
      r["original_max_position_embeddings"] = s.original_max_positions;
      r["beta_fast"] = s.beta_fast;
      r["beta_slow"] = s.beta_slow;
      r["attention_factor"] = kernels::yarn_attention_factor(s, s.factor);
      if (!s.truncate) r["truncate"] = false;  // transformers 5 (4.46 always truncates)
      j["max_position_embeddings"] = s.original_max_positions;
      break;
  }
  j["rope_scaling"] = r;
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  check(j.contains(key) && j.at(key).is_number_integer(),
        source + " has no integer \"" + std::string(key) + "\": it is not a complete config.json");
  return j.at(key).get<int64_t>();
}

// The sliding window of a config.json: Mistral's and Mixtral's sliding_window (null: none); Qwen's
// only with use_sliding_window, and then (transformers applies it from layer max_window_layers on,
// or as layer_types says) refused unless it reaches every position. A window at least as long as
// the model's context changes nothing and is read as none.
void read_hf_window(const json& j, const std::string& type, const std::string& source,
                    model::ModelConfig& c) {
  const json window = j.value("sliding_window", json());
  check(window.is_null() || (window.is_number_integer() && window.get<int64_t>() > 0),
        source + ": sliding_window " + window.dump() + " must be null or a positive length");
  const int64_t length = window.is_null() ? 0 : window.get<int64_t>();
  const bool reaches_all = length == 0 || length >= c.max_seq_len;
  if (type == "mistral" || type == "mixtral") {
    c.sliding_window = reaches_all ? 0 : length;
    return;
  }
  if (j.contains("layer_types") && j.at("layer_types").is_array())
    for (const json& layer : j.at("layer_types"))
      check(layer == "full_attention" || reaches_all,
            source + ": layer_types has " + layer.dump() + " layers; Lattice's " + type +
                " blocks attend to every earlier position in every layer");
  if (type == "llama") return;
  check(!j.value("use_sliding_window", false) || reaches_all,
        source + ": use_sliding_window is set; Lattice's " + type +
            " blocks attend to every earlier position (set it to false to train the model "
            "without its window)");
}

// The model_type a ModelConfig is saved as (check_exportable has refused the others).
std::string hf_model_type(const model::ModelConfig& c) {
  switch (c.family) {
    case model::Family::gpt2:
      return "gpt2";
    case model::Family::llama:
      return c.is_moe() ? "mixtral" : "llama";
    case model::Family::mistral:
      return c.is_moe() ? "mixtral" : "mistral";
    case model::Family::qwen2:
      return "qwen2";
    case model::Family::qwen3:
      return c.is_moe() ? "qwen3_moe" : "qwen3";
    case model::Family::deepseek:
      return "deepseek_v3";
  }
  throw Error("unknown model family (internal error)");
}

std::string hf_architecture(const std::string& type) {
  static const std::map<std::string, std::string> names = {
      {"gpt2", "GPT2LMHeadModel"},          {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},    {"mixtral", "MixtralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},        {"qwen3", "Qwen3ForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"deepseek_v3", "DeepseekV3ForCausalLM"}};
  return names.at(type);
}

}  // namespace

std::string hf_config_json(const model::ModelConfig& c) {
  check_exportable(c);
  json j;
  if (c.family == model::Family::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.max_seq_len},
         {"n_ctx", c.max_seq_len},
         {"n_embd", c.d_model},
         {"n_layer", c.n_layers},
         {"n_head", c.n_heads},
         {"n_inner", c.ffn_hidden},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", float_json(c.norm_eps)},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"initializer_range", float_json(c.init_std)},
         {"tie_word_embeddings", c.tied_embeddings}};
  } else {
    const std::string type = hf_model_type(c);
    j = {{"architectures", {hf_architecture(type)}},
         {"model_type", type},
         {"vocab_size", c.vocab_size},
         {"hidden_size", c.d_model},
         {"intermediate_size", c.is_moe() ? c.expert_ffn_hidden() : c.ffn_hidden},
         {"num_hidden_layers", c.n_layers},
         {"num_attention_heads", c.n_heads},
         {"num_key_value_heads", c.n_kv_heads},
         {"max_position_embeddings", c.max_seq_len},
         {"rms_norm_eps", float_json(c.norm_eps)},
         {"hidden_act", "silu"},
         {"initializer_range", float_json(c.init_std)},
         {"tie_word_embeddings", c.tied_embeddings},
         {"attention_dropout", 0.0}};
    const json window = c.sliding_window > 0 ? json(c.sliding_window) : json();
    if (type == "mixtral") {
      j["num_local_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.top_k;
      j["router_aux_loss_coef"] = c.moe_aux_loss_coef;
      j["output_router_logits"] = false;
      j["sliding_window"] = window;
    } else if (type == "qwen3_moe") {  // 4.x reads num_experts, 5.x num_local_experts
      j["num_experts"] = j["num_local_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.top_k;
      j["moe_intermediate_size"] = c.expert_ffn_hidden();
      j["intermediate_size"] = c.ffn_hidden;
      j["norm_topk_prob"] = c.moe_normalize;
      j["decoder_sparse_step"] = c.moe_layer_interval;
      j["mlp_only_layers"] = json::array();
      j["router_aux_loss_coef"] = c.moe_aux_loss_coef;
      j["output_router_logits"] = false;
    } else if (type == "mistral") {
      j["sliding_window"] = window;
    } else if (type == "llama") {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
    if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe") {
      j["use_sliding_window"] = false;  // qwen2: its q, k, v biases are implied by the type
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layers;
    }
    if (type == "qwen3" || type == "qwen3_moe") j["attention_bias"] = false;
    // transformers takes hidden_size / num_attention_heads without it (Qwen 3 defaults to 128).
    j["head_dim"] = c.head_dim();
    write_hf_rope(c, j);
    if (type == "deepseek_v3") {  // its dense width, latent attention, MoE and yarn's mscale
      j["intermediate_size"] = c.ffn_hidden;
      write_hf_deepseek_v3(c, j);
    }
  }
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

model::ModelConfig model_config_from_hf(const std::string& config_json, const std::string& source,
                                        std::vector<std::string>* ignored) {
  static const std::set<std::string> llama_like = {"llama", "mistral", "mixtral",
                                                   "qwen2", "qwen3",   "qwen3_moe"};
  json j;
  try {
    j = json::parse(config_json);
  } catch (const json::exception& e) {
    throw Error(source + " is not valid JSON (" + std::string(e.what()) + "): repair it");
  }
  check(j.is_object() && j.contains("model_type") && j.at("model_type").is_string(),
        source + " has no \"model_type\": it is not a Hugging Face config.json");
  const std::string type = j.at("model_type").get<std::string>();
  model::ModelConfig c;
  c.name = type + "-imported";
  try {
    if (type == "gpt2" || type == "deepseek_v3" || llama_like.count(type))
      check_hf_config_keys(j, type, source, ignored);
    if (type == "gpt2") {
      c.family = model::Family::gpt2;
      c.vocab_size = get_int(j, "vocab_size", source);
      c.max_seq_len = get_int(j, "n_positions", source);
      c.d_model = get_int(j, "n_embd", source);
      c.n_layers = get_int(j, "n_layer", source);
      c.n_heads = c.n_kv_heads = get_int(j, "n_head", source);
      c.ffn_hidden =
          j.value("n_inner", json()).is_null() ? 4 * c.d_model : j.at("n_inner").get<int64_t>();
      c.norm_eps = j.value("layer_norm_epsilon", 1e-5f);
      c.tied_embeddings = j.value("tie_word_embeddings", true);
      const std::string act = j.value("activation_function", std::string("gelu_new"));
      check(act == "gelu_new" || act == "gelu_pytorch_tanh",
            source + ": activation_function \"" + act +
                "\" is not GPT-2's tanh GELU (gelu_new), the one Lattice's GPT-2 blocks compute");
    } else if (llama_like.count(type)) {
      c.family = type == "qwen2"                          ? model::Family::qwen2
                 : type == "qwen3" || type == "qwen3_moe" ? model::Family::qwen3
                 : type == "mistral"                      ? model::Family::mistral
                                                          : model::Family::llama;
      c.vocab_size = get_int(j, "vocab_size", source);
      c.d_model = get_int(j, "hidden_size", source);
      c.ffn_hidden = get_int(j, "intermediate_size", source);
      c.n_layers = get_int(j, "num_hidden_layers", source);
      c.n_heads = get_int(j, "num_attention_heads", source);
      c.n_kv_heads = j.contains("num_key_value_heads") && !j.at("num_key_value_heads").is_null()
                         ? j.at("num_key_value_heads").get<int64_t>()
                         : c.n_heads;
      c.max_seq_len = get_int(j, "max_position_embeddings", source);
      c.norm_eps = j.value("rms_norm_eps", 1e-6f);
      // Heads of their own width (Qwen 3's 128; any of these types reads head_dim when set).
      if (j.contains("head_dim") && !j.at("head_dim").is_null()) {
        const int64_t head_dim = j.at("head_dim").get<int64_t>();
        check(head_dim > 0, source + ": head_dim must be positive");
        if (head_dim * c.n_heads != c.d_model) c.explicit_head_dim = head_dim;
      } else {
        check(type != "qwen3" && type != "qwen3_moe",
              source + ": a Qwen 3 config without head_dim (transformers takes 128): add it");
      }
      read_hf_rope(j, source, c);
      c.tied_embeddings = j.value("tie_word_embeddings", false);
      const std::string act = j.value("hidden_act", std::string("silu"));
      check(act == "silu",
            source + ": hidden_act \"" + act + "\" is not SiLU, the gate of Lattice's SwiGLU MLPs");
      read_hf_window(j, type, source, c);
      if (type == "llama")
        check(!j.value("mlp_bias", false),
              source + ": mlp_bias is set; Lattice's Llama MLPs have no biases");
      if (type != "qwen2")  // Qwen 2's q, k, v biases are its type's; the others have none
        check(!j.value("attention_bias", false),
              source + ": attention_bias is set; Lattice's " + type +
                  " blocks have no attention biases (a Llama with q/k/v biases is model_type "
                  "\"qwen2\")");
      if (type == "mixtral") {
        c.n_experts = get_int(j, "num_local_experts", source);
        c.top_k = get_int(j, "num_experts_per_tok", source);
        c.moe_aux_loss_coef = j.value("router_aux_loss_coef", 0.0);
        c.moe_names = model::MoeNames::mixtral;
      } else if (type == "qwen3_moe") {
        // transformers 4.x writes num_experts, 5.x num_local_experts.
        c.n_experts = j.contains("num_local_experts") ? get_int(j, "num_local_experts", source)
                                                      : get_int(j, "num_experts", source);
        c.top_k = get_int(j, "num_experts_per_tok", source);
        c.moe_ffn_hidden = get_int(j, "moe_intermediate_size", source);
        c.moe_normalize = j.value("norm_topk_prob", false);
        c.moe_layer_interval = j.value("decoder_sparse_step", int64_t{1});
        const json dense = j.value("mlp_only_layers", json::array());
        check(dense.is_array() && dense.empty(),
              source + ": mlp_only_layers " + dense.dump() +
                  " keeps dense MLPs in chosen layers; Lattice's MoE layers are every "
                  "decoder_sparse_step-th (set mlp_only_layers to [])");
        c.moe_aux_loss_coef = j.value("router_aux_loss_coef", 0.0);
        c.moe_names = model::MoeNames::deepseek;
      }
    } else if (type == "deepseek_v3") {
      read_hf_deepseek_v3(j, source, c, ignored);
      read_hf_rope(j, source, c);
    } else {
      throw Error(
          source + ": model_type \"" + type +
          "\" cannot be imported; Lattice reads gpt2, llama, mistral, mixtral, qwen2, qwen3, "
          "qwen3_moe and deepseek_v3 models");
    }
  } catch (const json::exception& e) {
    throw Error(source + " has a field of the wrong type (" + std::string(e.what()) +
                "): repair it");
  }
  c.validate();
  return c;
}

}  // namespace lattice::train
