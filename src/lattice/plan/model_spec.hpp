// The model as the planner sees it: the trainer's model description (model::ModelConfig, with its
// one preset table) plus the sequence length the plan trains at. Exact parameter counts by the
// planner's own formula (tests/plan checks them against the ParameterStore of the built model).
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/model_config.hpp"

namespace lattice::plan {

struct ModelSpec : model::ModelConfig {
  // Tokens per sequence in training (training.seq_len); the presets train at their max_seq_len.
  int64_t seq_len = 0;
};

// `config` trained at `seq_len` tokens per sequence (0: its max_seq_len).
ModelSpec planning_model(const model::ModelConfig& config, int64_t seq_len = 0);

// Exact parameter counts from the dimensions.
struct ParameterCount {
  int64_t embedding = 0;  // token (+ position) embedding
  // Per layer (the mean over the layers when MoE layers alternate with dense ones): everything
  // but the routed experts (attention, norms, dense MLPs, routers, shared experts), and the routed
  // experts' MLPs (a dense model: its MLP, which expert parallelism leaves whole at ep = 1).
  int64_t per_layer_dense = 0;
  int64_t per_layer_experts = 0;
  int64_t final_norm = 0;
  int64_t output_head = 0;  // 0 when tied to the embedding
  int64_t total = 0;
  int64_t active = 0;         // per token: only top_k experts count
  int64_t non_embedding = 0;  // total minus embedding and untied head (Kaplan's N)
};

ParameterCount count_parameters(const ModelSpec& model);

// Throws lattice::Error when the model is inconsistent (ModelConfig::validate) or the sequence
// length is not positive.
void validate(const ModelSpec& model);

// The preset called `name` (model::model_preset) at its max_seq_len; throws lattice::Error listing
// the presets when there is none.
ModelSpec model_preset(const std::string& name);

// A GPT-style (Megatron) model from the dimensions of the published tables: learned positions, tied
// embeddings, LayerNorm and biases, 4h MLP, dropout 0.1, trained at its full sequence length.
ModelSpec megatron_gpt(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                       int64_t vocab = 51200, int64_t seq_len = 2048);

}  // namespace lattice::plan
