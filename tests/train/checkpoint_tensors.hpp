// Test helper: the logical tensors of a checkpoint of any layout (train/checkpoint_reader.hpp),
// for comparing checkpoints written by different layouts bit for bit.
#pragma once

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lattice/train/checkpoint_reader.hpp"

namespace lattice::testing {

// name -> values of every logical tensor; `with_moments` false keeps the weights only.
inline std::map<std::string, std::vector<float>> checkpoint_tensors(
    const std::filesystem::path& dir, bool with_moments = true) {
  train::CheckpointReader reader(dir.string());
  std::map<std::string, std::vector<float>> tensors;
  for (const std::string& name : reader.names()) {
    if (!with_moments && name.find('/') != std::string::npos) continue;
    const Shape& shape = reader.global_shape(name);
    std::vector<float>& values = tensors[name];
    values.resize(static_cast<size_t>(shape_numel(shape)));
    reader.read(name, shape, values.data());
  }
  return tensors;
}

// True when both checkpoints hold the same tensors with the same bits.
inline bool same_checkpoint_tensors(const std::filesystem::path& a, const std::filesystem::path& b,
                                    bool with_moments = true) {
  const auto x = checkpoint_tensors(a, with_moments), y = checkpoint_tensors(b, with_moments);
  if (x.size() != y.size()) return false;
  for (const auto& [name, values] : x) {
    auto it = y.find(name);
    if (it == y.end() || it->second.size() != values.size() ||
        std::memcmp(values.data(), it->second.data(), values.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace lattice::testing
