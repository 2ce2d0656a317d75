// Model configuration: the architecture family (GPT-2 or Llama), its dimensions, the named presets
// and the checks that refuse a model whose dimensions do not fit together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lattice::model {

enum class Family { gpt2, llama };

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int64_t vocab_size = 256;
  int64_t max_seq_len = 256;  // learned positions (GPT-2) / RoPE table length (Llama)
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;    // grouped-query attention: n_heads must be a multiple of it
  int64_t ffn_hidden = 512;  // GPT-2: 4·d_model; Llama: SwiGLU inner size
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tied_embeddings = true;  // GPT-2 ties the head to the token embedding
  float init_std = 0.02f;

  int64_t head_dim() const { return d_model / n_heads; }
  // Throws lattice::Error naming the first inconsistency and how to fix it.
  void validate() const;
  // Number of parameters; `with_position_embedding=false` leaves out GPT-2's learned positions (the
  // N of the 6N FLOP formula).
  int64_t parameter_count(bool with_position_embedding = true) const;
  // Model FLOPs per trained token at sequence length T: 6N + 12·L·T·d (forward + backward, the
  // attention score and value products counted as in PaLM's MFU definition; N without positions).
  double flops_per_token(int64_t seq_len) const;
};

std::string family_name(Family family);
Family parse_family(const std::string& name);

// Presets: gpt2-tiny, gpt2-small-test, gpt2-124m, gpt2-350m, gpt2-774m, llama-tiny,
// llama-small-test, llama-60m, llama-1b. Throws lattice::Error listing the names for an unknown
// one.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace lattice::model
