// Hugging Face config.json <-> Lattice's ModelConfig: the config a `transformers` model of a
// family is saved with, written from a model configuration and read back into one (both formats
// transformers writes: 4.x's top-level rope_theta / rope_scaling and 5.x's rope_parameters). What
// a family's config says and Lattice cannot compute is refused with one line naming the key, never
// dropped. The weights and the directory are hf_format.hpp's.
#pragma once

#include <string>
#include <vector>

#include "lattice/model/model_config.hpp"

namespace lattice::train {

// config.json for `config` (model_type gpt2, llama, qwen2 or mixtral). Throws Error naming what a
// `transformers` model of that type cannot express (e.g. DeepSeek-style MoE, GELU experts, MoE
// only in some layers, a sigmoid router).
std::string hf_config_json(const model::ModelConfig& config);
// The model configuration of a Hugging Face config.json (`source` names it in errors): gpt2,
// llama, qwen2 and mixtral model types, RoPE's base at the top level (transformers 4.x) or in
// rope_parameters (5.x); anything else is one Error line naming the supported ones. Every key is
// either read or known not to change the arithmetic (hf_config_keys.hpp); the settings read but not
// applied (a nonzero dropout) are appended to `ignored` as one line each, when given.
model::ModelConfig model_config_from_hf(const std::string& config_json, const std::string& source,
                                        std::vector<std::string>* ignored = nullptr);

}  // namespace lattice::train
