// A transformer block as data: the components one TransformerBlock is composed from — its
// attention sub-layer and its MLP sub-layer (GELU, SwiGLU or a mixture of experts), each with its
// pre-norm and Hugging Face's parameter names — and the parallelize plan that says which of their
// projections is column- and which row-split. A model family is a function from a ModelConfig and
// a layer index to one (families/*.cpp, a few dozen lines each); adding a family adds such a
// function and its entry in describe_block (docs/extending.md).
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "lattice/model/components/attention.hpp"
#include "lattice/model/components/gelu_mlp.hpp"
#include "lattice/model/components/moe_layer.hpp"
#include "lattice/model/components/swiglu_mlp.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/parallel/tensor/parallelize_plan.hpp"

namespace lattice::model {

using MlpDescription = std::variant<GeluMlpDescription, SwiGluMlpDescription, MoeLayerDescription>;

struct BlockDescription {
  std::string prefix;  // every parameter's name starts with it ("transformer.h.3.")
  int64_t d_model = 0;
  float norm_eps = 1e-5f;
  AttentionDescription attention;
  MlpDescription mlp;
  parallel::ParallelizePlan plan = parallel::ParallelizePlan::megatron();
};

// The families' blocks (families/*.cpp). Mistral's is Llama's: the sliding window any RoPE
// family takes from the config is what its Hugging Face type adds.
BlockDescription gpt2_block(const ModelConfig& config, int64_t layer);
BlockDescription llama_block(const ModelConfig& config, int64_t layer);
BlockDescription qwen2_block(const ModelConfig& config, int64_t layer);
BlockDescription qwen3_block(const ModelConfig& config, int64_t layer);
BlockDescription deepseek_block(const ModelConfig& config, int64_t layer);

// Block `layer` of a model of `config`, as its family describes it.
BlockDescription describe_block(const ModelConfig& config, int64_t layer);

}  // namespace lattice::model
