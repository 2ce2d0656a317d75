// The index of a sharded checkpoint (index.json): for every logical tensor — the weights under
// their Hugging Face names, the AdamW moments as "exp_avg/<name>" and "exp_avg_sq/<name>" — its
// logical shape and the pieces the ranks wrote. A piece is a run of elements [begin, end) of one
// tensor-parallel slice of the tensor (model::TensorShard; the whole tensor when the shard count is
// 1), flattened row-major, stored under `key` in one of the checkpoint's safetensors files with the
// CRC-32C of its bytes. A rank writes the runs it owns (its ZeRO shard of each bucket, its slices,
// its stages and experts), so every element of every slice is in exactly one piece; the index
// checks that coverage when it is built and when it is read, so a missing rank file or a lost
// piece is found before any weight is loaded.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::train {

struct CheckpointPiece {
  std::string file;  // the safetensors file (relative to the checkpoint directory)
  std::string key;   // the tensor's name in that file
  model::TensorShard shard;
  Shape slice_shape;           // the shard's local shape (padding included)
  int64_t begin = 0, end = 0;  // flat elements of the slice this piece holds
  uint32_t crc32c = 0;         // of the piece's bytes (fp32, little-endian)
};

struct CheckpointTensor {
  Shape global_shape;
  std::vector<CheckpointPiece> pieces;
};

// The tensors of one checkpoint, by logical name.
using CheckpointIndex = std::map<std::string, CheckpointTensor>;

// The piece list as JSON (index.json's "tensors", a rank's piece list) and back. from_json throws
// Error naming `source` on damage.
nlohmann::json checkpoint_index_to_json(const CheckpointIndex& index);
CheckpointIndex checkpoint_index_from_json(const nlohmann::json& tensors,
                                           const std::string& source);

// Adds `more`'s pieces to `index` (the same tensor from several ranks: the logical shapes must
// agree).
void merge_checkpoint_index(CheckpointIndex& index, const CheckpointIndex& more);

// Throws Error (naming `source`, the tensor and the missing or doubled elements) unless every
// tensor's pieces cover each of its slices exactly once: the shard counts agree, every shard
// index below the count is present, and each slice's runs tile [0, numel) without overlap.
void check_checkpoint_coverage(const CheckpointIndex& index, const std::string& source);

// A parameter description of one piece's slice (name, shape, global shape, shard), the form
// parallel::place_slice walks.
model::ParameterInfo slice_info(const std::string& name, const CheckpointTensor& tensor,
                                const CheckpointPiece& piece);

}  // namespace lattice::train
