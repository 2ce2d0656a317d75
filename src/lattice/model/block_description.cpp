// The family table: see block_description.hpp.
#include "lattice/model/block_description.hpp"

#include "lattice/core/error.hpp"

namespace lattice::model {

BlockDescription describe_block(const ModelConfig& config, int64_t layer) {
  switch (config.family) {
    case Family::gpt2:
      check(!config.is_moe(),
            "model.n_experts = " + std::to_string(config.n_experts) +
                ": MoE layers are built on Llama blocks; set model.family = \"llama\" (or use a "
                "MoE preset: mixtral-tiny, deepseek-moe-tiny)");
      return gpt2_block(config, layer);
    case Family::llama:
    case Family::mistral:
      return llama_block(config, layer);
    case Family::qwen3:
      return qwen3_block(config, layer);
    case Family::deepseek:
      return deepseek_block(config, layer);
    case Family::qwen2:
      check(!config.is_moe(), "model.n_experts = " + std::to_string(config.n_experts) +
                                  ": Qwen 2 MoE layers are not built yet; use model.family = "
                                  "\"llama\" for a MoE model");
      return qwen2_block(config, layer);
  }
  throw Error("unknown model family (internal error)");
}

}  // namespace lattice::model
