// Hugging Face interop: see hf_format.hpp.
#include "lattice/train/hf_format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Refuses a model `transformers` cannot express as the model type we write.
void check_exportable(const model::ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    throw Error("Hugging Face export: " + what +
                " has no transformers equivalent among gpt2, llama, qwen2 and mixtral; train with "
                "settings that do, or export the Lattice checkpoint as it is");
  };
  if (c.family == model::Family::gpt2 && c.n_kv_heads != c.n_heads)
    refuse("GPT-2 with grouped-query attention (n_kv_heads < n_heads)");
  if (!c.is_moe()) return;
  if (c.moe_names != model::MoeNames::mixtral) refuse("a DeepSeek-style MoE (model.moe_names)");
  if (c.moe_activation != model::MoeActivation::swiglu) refuse("GELU experts");
  if (c.moe_layer_interval != 1) refuse("MoE in every k-th layer only (k > 1)");
  if (c.moe_shared_experts > 0) refuse("shared experts");
  if (c.moe_score != kernels::RouterScore::softmax || !c.moe_normalize || c.moe_scaling != 1.0f)
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

// MemAvailable of /proc/meminfo in bytes (0 where it cannot be read: no limit).
int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Transposes a row-major [rows, cols] matrix into [cols, rows].
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// The tokenizer files a spec names: {source path, name in a Hugging Face directory}.
std::vector<std::pair<fs::path, std::string>> tokenizer_files(const std::string& spec) {
  if (spec.empty() || spec == "byte") return {};
  fs::path path(spec.rfind("tiktoken:", 0) == 0 ? spec.substr(9) : spec);
  check(fs::exists(path), "Hugging Face export: the tokenizer " + spec +
                              " does not exist: pass --tokenizer with its path, or --tokenizer "
                              "byte to export without tokenizer files");
  if (fs::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "encoder.json", "vocab.json"})
      if (fs::exists(path / name)) return tokenizer_files((path / name).string());
    throw Error("Hugging Face export: " + spec +
                " holds no tokenizer.json, encoder.json or vocab.json: pass the tokenizer's path");
  }
  const std::string name = path.filename().string();
  if (name == "encoder.json")
    return {{path, "vocab.json"}, {path.parent_path() / "vocab.bpe", "merges.txt"}};
  if (name == "vocab.json")
    return {{path, "vocab.json"}, {path.parent_path() / "merges.txt", "merges.txt"}};
  if (path.extension() == ".json") return {{path, "tokenizer.json"}};
  throw Error("Hugging Face export: the tokenizer " + spec +
              " has no Hugging Face form (tiktoken ranks): pass --tokenizer byte to export without "
              "tokenizer files");
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

}  // namespace

bool hf_transposed(const model::ModelConfig& config, const std::string& name) {
  if (config.family != model::Family::gpt2) return false;
  for (const char* suffix :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (ends_with(name, suffix)) return true;
  return false;
}

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
    const bool qwen2 = c.family == model::Family::qwen2;
    const char* architecture = c.is_moe() ? "MixtralForCausalLM"
                               : qwen2    ? "Qwen2ForCausalLM"
                                          : "LlamaForCausalLM";
    j = {{"architectures", {architecture}},
         {"model_type", c.is_moe() ? "mixtral"
                        : qwen2    ? "qwen2"
                                   : "llama"},
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
    if (c.is_moe()) {
      j["num_local_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.top_k;
      j["router_aux_loss_coef"] = c.moe_aux_loss_coef;
      j["output_router_logits"] = false;
      j["sliding_window"] = nullptr;
    } else if (qwen2) {  // its q, k, v biases are implied by the model type
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layers;
    } else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
    write_hf_rope(c, j);
  }
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

model::ModelConfig model_config_from_hf(const std::string& config_json, const std::string& source) {
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
    } else if (type == "llama" || type == "mixtral" || type == "qwen2") {
      c.family = type == "qwen2" ? model::Family::qwen2 : model::Family::llama;
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
      read_hf_rope(j, source, c);
      c.tied_embeddings = j.value("tie_word_embeddings", false);
      const std::string act = j.value("hidden_act", std::string("silu"));
      check(act == "silu",
            source + ": hidden_act \"" + act + "\" is not SiLU, the gate of Lattice's SwiGLU MLPs");
      if (type == "qwen2") {
        const json window = j.value("sliding_window", json());
        check(!j.value("use_sliding_window", false) || window.is_null() ||
                  window.get<int64_t>() >= c.max_seq_len,
              source +
                  ": use_sliding_window is set; Lattice's Qwen 2 blocks attend to every earlier "
                  "position (set it to false to train the model without its window)");
      } else {
        check(!j.value("attention_bias", false) && !j.value("mlp_bias", false),
              source +
                  ": attention_bias or mlp_bias is set; Lattice's Llama blocks have no biases "
                  "(a Llama with q/k/v biases is model_type \"qwen2\")");
      }
      if (j.contains("head_dim") && !j.at("head_dim").is_null())
        check(j.at("head_dim").get<int64_t>() == c.d_model / c.n_heads,
              source +
                  ": head_dim differs from hidden_size / num_attention_heads, which Lattice's "
                  "attention assumes");
      if (type == "mixtral") {
        c.n_experts = get_int(j, "num_local_experts", source);
        c.top_k = get_int(j, "num_experts_per_tok", source);
        c.moe_aux_loss_coef = j.value("router_aux_loss_coef", 0.0);
        c.moe_names = model::MoeNames::mixtral;
        const json window = j.value("sliding_window", json());
        check(window.is_null() || window.get<int64_t>() >= c.max_seq_len,
              source +
                  ": sliding_window attention is set; Lattice attends to every earlier "
                  "position");
      }
    } else {
      throw Error(source + ": model_type \"" + type +
                  "\" cannot be imported; Lattice reads gpt2, llama, qwen2 and mixtral models");
    }
  } catch (const json::exception& e) {
    throw Error(source + " has a field of the wrong type (" + std::string(e.what()) +
                "): repair it");
  }
  c.validate();
  return c;
}

HfExportSummary export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                          int64_t max_shard_bytes, const std::string& tokenizer_spec,
                          int64_t memory_limit_bytes) {
  check(max_shard_bytes > 0, "--max-shard-mb must be positive");
  check(!fs::exists(out_dir),
        "Hugging Face export: " + out_dir + " already exists: choose a new --out or remove it");
  CheckpointReader reader(checkpoint_dir);
  const model::ModelConfig& config = reader.model_config();
  const std::string config_json = hf_config_json(config);
  const auto tokenizer = tokenizer_files(tokenizer_spec);
  // Every weight the model declares must be in the checkpoint, and nothing else: a lost expert or
  // shard is an error here, not a smaller export.
  const auto declared = model::Transformer::declared_only(config);
  std::vector<const model::ParameterInfo*> weights;
  for (const model::ParameterInfo& p : declared->parameters().parameters()) {
    check(reader.contains(p.name), "Hugging Face export: checkpoint " + checkpoint_dir +
                                       " lacks '" + p.name +
                                       "', which the model declares: it is incomplete; export an "
                                       "earlier checkpoint");
    weights.push_back(&p);
  }
  size_t stored = 0;
  for (const std::string& name : reader.names()) stored += name.find('/') == std::string::npos;
  check(stored == weights.size(), "Hugging Face export: checkpoint " + checkpoint_dir + " holds " +
                                      std::to_string(stored) + " weights but the model declares " +
                                      std::to_string(weights.size()) +
                                      ": it does not match its own configuration");
  // Files of at most max_shard_bytes, in the model's order.
  std::vector<std::vector<const model::ParameterInfo*>> files(1);
  int64_t in_file = 0;
  for (const model::ParameterInfo* p : weights) {
    const int64_t bytes = p->numel * static_cast<int64_t>(sizeof(float));
    if (in_file > 0 && in_file + bytes > max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(p);
    in_file += bytes;
  }
  // What is in memory at once: the largest file's tensors, and a transposed copy of its largest.
  int64_t peak = 0;
  for (const auto& file : files) {
    int64_t bytes = 0, largest = 0;
    for (const model::ParameterInfo* p : file) {
      bytes += p->numel * static_cast<int64_t>(sizeof(float));
      largest = std::max(largest, p->numel * static_cast<int64_t>(sizeof(float)));
    }
    peak = std::max(peak, bytes + largest);
  }
  const int64_t limit = memory_limit_bytes > 0 ? memory_limit_bytes : available_memory_bytes();
  check(limit <= 0 || peak <= limit,
        "Hugging Face export: writing " + checkpoint_dir + " needs " + std::to_string(peak >> 20) +
            " MiB in memory at once (its largest file and tensor), " + "more than the " +
            std::to_string(limit >> 20) +
            " MiB available: lower --max-shard-mb (a single tensor larger than memory cannot be "
            "exported on this host)");
  HfExportSummary summary;
  summary.files = static_cast<int>(files.size());
  StagedDirectory stage(out_dir);
  json weight_map = json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    char name[64];
    if (files.size() == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    std::vector<std::vector<float>> buffers;
    std::vector<SafetensorsEntry> entries;
    for (const model::ParameterInfo* p : files[f]) {
      std::vector<float>& values = buffers.emplace_back(static_cast<size_t>(p->numel));
      reader.read(p->name, p->global_shape, values.data());
      SafetensorsEntry e;
      e.name = p->name;
      e.dtype = DType::f32;
      e.shape = p->global_shape;
      if (hf_transposed(config, p->name)) {  // Conv1D: [in, out]
        std::vector<float> out(values.size());
        transpose(values.data(), p->global_shape[0], p->global_shape[1], out.data());
        values.swap(out);
        e.shape = {p->global_shape[1], p->global_shape[0]};
      }
      e.data = values.data();
      e.nbytes = values.size() * sizeof(float);
      summary.bytes += static_cast<int64_t>(e.nbytes);
      ++summary.tensors;
      weight_map[p->name] = name;
      entries.push_back(std::move(e));
    }
    write_safetensors(stage.file_path(name), entries, {{"format", "pt"}});
  }
  if (files.size() > 1) {
    const json index = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    write_text_atomic(stage.file_path("model.safetensors.index.json"), index.dump(2) + "\n");
  }
  write_text_atomic(stage.file_path("config.json"), config_json);
  for (const auto& [source, name] : tokenizer) {
    check(fs::exists(source), "Hugging Face export: " + source.string() +
                                  " (the tokenizer's) does not exist: pass --tokenizer with a "
                                  "complete tokenizer");
    write_text_atomic(stage.file_path(name), read_file_text(source.string()));
    summary.tokenizer += (summary.tokenizer.empty() ? "" : ", ") + name;
  }
  stage.commit();
  return summary;
}

model::ModelConfig import_hf(const std::string& hf_dir, const std::string& run_dir) {
  const fs::path dir(hf_dir);
  const fs::path config_path = dir / "config.json";
  check(fs::exists(config_path), hf_dir +
                                     " has no config.json: point at a Hugging Face model "
                                     "directory (what save_pretrained writes)");
  const model::ModelConfig config =
      model_config_from_hf(read_file_text(config_path.string()), config_path.string());
  check(latest_checkpoint(run_dir).empty(),
        run_dir + " already holds checkpoints: import into a new run directory");
  // Which file holds each tensor.
  std::map<std::string, std::string> file_of;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    try {
      const json index = json::parse(read_file_text(index_path.string()));
      for (const auto& [name, file] : index.at("weight_map").items())
        file_of[name] = file.get<std::string>();
    } catch (const json::exception& e) {
      throw Error(index_path.string() + " is damaged (" + std::string(e.what()) +
                  "): repair it or save the model again");
    }
  } else {
    check(fs::exists(dir / "model.safetensors"),
          hf_dir +
              " has neither model.safetensors nor model.safetensors.index.json: save the "
              "model with safe_serialization (the default of save_pretrained)");
    for (const std::string& name : SafetensorsFile((dir / "model.safetensors").string()).names())
      file_of[name] = "model.safetensors";
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  model::Transformer model(config, nullptr);
  model::ParameterStore& store = model.parameters();
  std::set<std::string> used;
  std::vector<float> scratch;
  for (const model::ParameterInfo& p : store.parameters()) {
    auto it = file_of.find(p.name);
    check(it != file_of.end(), hf_dir + " lacks the weight '" + p.name + "' that a " + config.name +
                                   " model of its config.json has");
    auto& file = files[it->second];
    if (!file) file = std::make_unique<SafetensorsFile>((dir / it->second).string());
    const SafetensorsEntry& entry = file->entry(p.name);
    const bool transposed = hf_transposed(config, p.name);
    const Shape want = transposed ? Shape{p.shape[1], p.shape[0]} : p.shape;
    check(entry.shape == want, hf_dir + ": '" + p.name + "' has another shape than its " +
                                   "config.json implies: the files and the config disagree");
    float* dst = store.mutable_values() + p.offset;
    if (transposed) {
      scratch.resize(static_cast<size_t>(p.numel));
      file->read_f32(p.name, scratch.data(), p.numel);
      transpose(scratch.data(), want[0], want[1], dst);
    } else {
      file->read_f32(p.name, dst, p.numel);
    }
    used.insert(p.name);
  }
  for (const auto& [name, file] : file_of) {
    const bool buffer = ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
                        ends_with(name, "rotary_emb.inv_freq");
    const bool tied_head = name == "lm_head.weight" && config.tied_embeddings;
    check(used.count(name) || buffer || tied_head,
          hf_dir + " has the weight '" + name + "', which a " + config.name +
              " model of its config.json does not: the files and the config disagree");
  }
  // The step-0 checkpoint (moments zero), and the settings to train from it.
  TrainConfig settings = load_train_config("", {"job.run_dir=" + run_dir});
  settings.model = config;
  // The [model] keys in full; without the default preset's name, which would describe another
  // model.
  std::string toml = settings.to_toml();
  const size_t preset = toml.find("\npreset = ");
  if (preset != std::string::npos) toml.erase(preset + 1, toml.find('\n', preset + 1) - preset);
  const std::unique_ptr<kernels::Ops> ops = kernels::make_ops(Device::cpu);
  optim::AdamWOptimizer adamw(*ops, store, settings.optimizer.adamw, nullptr);
  save_checkpoint(run_dir, model, adamw, TrainerState{0, 0, settings.training.seed}, toml, 2);
  write_text_atomic((fs::path(run_dir) / "import.toml").string(), toml);
  return config;
}

}  // namespace lattice::train
