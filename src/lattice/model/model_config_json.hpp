// ModelConfig <-> JSON: the form stored in checkpoints' "lattice.model" metadata and read by the
// PyTorch reference scripts (tests/reference/lattice_torch.py). The MoE and dropout fields are
// written only when set, and read as absent = dense, no dropout.
#pragma once

#include <string>

#include "lattice/model/model_config.hpp"

namespace lattice::model {

std::string model_config_to_json(const ModelConfig& config);
// Throws lattice::Error naming the missing or mistyped field.
ModelConfig model_config_from_json(const std::string& json);

}  // namespace lattice::model
