// Model dimensions as the planner sees them (independent of the trainer's model config): layers,
// widths, heads, vocabulary, sequence, experts, and the architectural switches that change
// parameter and FLOP counts. Presets cover GPT-2/3, Llama 2/3, Mixtral and the models of the
// Megatron-LM and Korthikanti tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lattice::plan {

struct ModelSpec {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;    // grouped-query attention; equal to heads for multi-head attention
  int64_t ffn_hidden = 0;  // MLP inner width (per expert for MoE)
  int64_t vocab = 0;
  int64_t seq_len = 0;
  int64_t experts = 1;  // MLP experts per layer (1 = dense)
  int64_t top_k = 1;    // experts each token is routed to
  bool tied_embeddings = true;
  bool gated_mlp = false;                   // SwiGLU: three MLP matrices instead of two
  bool learned_position_embeddings = true;  // GPT-style wpe table (Llama uses RoPE: none)
  bool layernorm_with_bias = true;          // LayerNorm (weight + bias) or RMSNorm (weight only)
  bool linear_bias = true;                  // biases on the attention and MLP projections
  bool dropout = true;                      // dropout masks stored (GPT/Megatron) or not (Llama)

  int64_t head_dim() const { return hidden / heads; }
  bool is_moe() const { return experts > 1; }
};

// Exact parameter counts from the dimensions.
struct ParameterCount {
  int64_t embedding = 0;          // token (+ position) embedding
  int64_t per_layer_dense = 0;    // attention + norms (+ router), everything but the experts' MLPs
  int64_t per_layer_experts = 0;  // all MLP weights of one layer (one expert's MLP when dense)
  int64_t final_norm = 0;
  int64_t output_head = 0;  // 0 when tied to the embedding
  int64_t total = 0;
  int64_t active = 0;         // per token: only top_k experts count
  int64_t non_embedding = 0;  // total minus embedding and untied head (Kaplan's N)
};

ParameterCount count_parameters(const ModelSpec& model);

// Throws lattice::Error when dimensions are inconsistent (hidden not divisible by heads, heads not
// by kv_heads, top_k > experts, non-positive sizes).
void validate(const ModelSpec& model);

// Presets: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, gpt3-175b, llama-7b, llama-13b, llama-70b,
// llama3-8b, llama3-70b, llama3-405b, mixtral-8x7b, megatron-1.7b, megatron-7.5b, megatron-39.1b,
// megatron-145.6b, megatron-1t (Narayanan et al. Table 1), korthikanti-22b, korthikanti-175b,
// korthikanti-530b, korthikanti-1t (Korthikanti et al. Table 3).
const std::vector<ModelSpec>& model_presets();
// The preset called `name`; throws lattice::Error listing the presets when there is none.
ModelSpec model_preset(const std::string& name);

// A GPT-style (Megatron) model from the dimensions of the published tables: learned positions, tied
// embeddings, LayerNorm and biases, 4h MLP, dropout.
ModelSpec megatron_gpt(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                       int64_t vocab = 51200, int64_t seq_len = 2048);

}  // namespace lattice::plan
