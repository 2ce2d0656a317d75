// Model configuration and presets: see model_config.hpp.
#include "lattice/model/model_config.hpp"

#include <functional>
#include <map>

#include "lattice/core/error.hpp"

namespace lattice::model {

std::string family_name(Family family) {
  return family == Family::gpt2 ? "gpt2" : "llama";
}

Family parse_family(const std::string& name) {
  if (name == "gpt2") return Family::gpt2;
  if (name == "llama") return Family::llama;
  throw Error("unknown model family '" + name + "': use \"gpt2\" or \"llama\"");
}

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t value) {
    check(value > 0,
          "model." + std::string(key) + " must be positive, got " + std::to_string(value));
  };
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("ffn_hidden", ffn_hidden);
  check(d_model % n_heads == 0, "model.d_model (" + std::to_string(d_model) +
                                    ") is not divisible by model.n_heads (" +
                                    std::to_string(n_heads) + "): choose heads that divide it");
  check(n_heads % n_kv_heads == 0,
        "model.n_heads (" + std::to_string(n_heads) + ") is not a multiple of model.n_kv_heads (" +
            std::to_string(n_kv_heads) + "): grouped-query attention needs whole groups");
  if (family == Family::gpt2) {
    check(n_kv_heads == n_heads,
          "gpt2 models have no grouped-query attention: set model.n_kv_heads "
          "equal to model.n_heads (" +
              std::to_string(n_heads) + ")");
  } else {
    check(head_dim() % 2 == 0, "llama models need an even head dimension for RoPE, got " +
                                   std::to_string(head_dim()) + ": change d_model or n_heads");
  }
  check(norm_eps > 0, "model.norm_eps must be positive");
  check(init_std > 0, "model.init_std must be positive");
}

int64_t ModelConfig::parameter_count(bool with_position_embedding) const {
  const int64_t C = d_model, kv = n_kv_heads * head_dim();
  int64_t per_layer = 0, embed = vocab_size * C, head = tied_embeddings ? 0 : vocab_size * C;
  if (family == Family::gpt2) {
    per_layer = 2 * C                          // ln_1
                + 3 * C * C + 3 * C            // c_attn
                + C * C + C                    // attn c_proj
                + 2 * C                        // ln_2
                + ffn_hidden * C + ffn_hidden  // c_fc
                + C * ffn_hidden + C;          // mlp c_proj
    int64_t final_norm = 2 * C;
    int64_t positions = with_position_embedding ? max_seq_len * C : 0;
    return embed + positions + n_layers * per_layer + final_norm + head;
  }
  per_layer = C                      // input_layernorm
              + C * C + 2 * kv * C   // q, k, v
              + C * C                // o_proj
              + C                    // post_attention_layernorm
              + 3 * ffn_hidden * C;  // gate, up, down
  return embed + n_layers * per_layer + C + head;
}

double ModelConfig::flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(parameter_count(false)) + 12.0 * static_cast<double>(n_layers) *
                                                                 static_cast<double>(seq_len) *
                                                                 static_cast<double>(d_model);
}

namespace {

ModelConfig gpt2(const std::string& name, int64_t layers, int64_t d, int64_t heads, int64_t vocab,
                 int64_t seq) {
  ModelConfig c;
  c.name = name;
  c.family = Family::gpt2;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = heads;
  c.ffn_hidden = 4 * d;
  c.tied_embeddings = true;
  return c;
}

ModelConfig llama(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                  int64_t kv_heads, int64_t ffn, int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.name = name;
  c.family = Family::llama;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tied_embeddings = false;
  return c;
}

const std::map<std::string, std::function<ModelConfig()>>& presets() {
  static const std::map<std::string, std::function<ModelConfig()>> table = {
      {"gpt2-tiny", [] { return gpt2("gpt2-tiny", 2, 32, 4, 64, 32); }},
      {"gpt2-small-test", [] { return gpt2("gpt2-small-test", 4, 256, 4, 8192, 256); }},
      {"gpt2-demo", [] { return gpt2("gpt2-demo", 4, 192, 6, 256, 128); }},
      {"gpt2-124m", [] { return gpt2("gpt2-124m", 12, 768, 12, 50257, 1024); }},
      {"gpt2-350m", [] { return gpt2("gpt2-350m", 24, 1024, 16, 50257, 1024); }},
      {"gpt2-774m", [] { return gpt2("gpt2-774m", 36, 1280, 20, 50257, 1024); }},
      {"llama-tiny", [] { return llama("llama-tiny", 2, 32, 4, 2, 64, 64, 32); }},
      {"llama-small-test", [] { return llama("llama-small-test", 4, 256, 8, 4, 688, 8192, 256); }},
      {"llama-60m", [] { return llama("llama-60m", 8, 512, 8, 4, 1376, 32000, 1024); }},
      {"llama-1b", [] { return llama("llama-1b", 16, 2048, 32, 8, 8192, 128256, 2048); }},
  };
  return table;
}

}  // namespace

ModelConfig model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (const auto& [key, _] : presets()) names += (names.empty() ? "" : ", ") + key;
    throw Error("unknown model preset '" + name + "': choose one of " + names);
  }
  return it->second();
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [key, _] : presets()) names.push_back(key);
  return names;
}

}  // namespace lattice::model
