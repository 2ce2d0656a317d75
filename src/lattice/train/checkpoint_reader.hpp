// CheckpointReader: the logical tensors of a checkpoint, whatever layout wrote it. A sharded
// checkpoint (index.json, checkpoint_index.hpp) is read piece by piece: each piece's CRC-32C is
// checked and the pieces are put together into the slice they tile, the slices into the logical
// tensor. A checkpoint from before the index (model.safetensors and optimizer.safetensors holding
// every tensor whole) is read as it is. What a load into any layout (checkpoint.hpp), `lattice
// generate` and the tests read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lattice/io/safetensors.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/train/checkpoint_index.hpp"

namespace lattice::train {

struct TrainerState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_consumed = 0;  // the training sampler's position
  uint64_t seed = 0;
  std::string replica_quorum;  // DiLoCo with replica groups: the last agreed QuorumRecord's JSON
};

class CheckpointReader {
 public:
  // Opens `dir` (a checkpoint directory) and reads its index, state and model configuration;
  // throws one Error line naming the file on anything missing or damaged.
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();

  const std::string& directory() const { return dir_; }
  const model::ModelConfig& model_config() const { return config_; }
  const TrainerState& state() const { return state_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // True for a sharded checkpoint (index.json), false for a whole one.
  bool sharded() const { return sharded_; }
  // The logical tensors' names (weights, then "exp_avg/…" and "exp_avg_sq/…" where present).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  // The logical shape of tensor `name` (Error when absent).
  const Shape& global_shape(const std::string& name) const;

  // Fills `out` with the logical tensor `name` (shape_numel(global_shape) fp32 elements). Error
  // when it is absent, has another logical shape, or a piece fails its checksum.
  void read(const std::string& name, const Shape& global_shape, float* out);

 private:
  const SafetensorsFile& file(const std::string& relative);

  std::string dir_;
  model::ModelConfig config_;
  TrainerState state_;
  int64_t optimizer_steps_ = 0;
  bool sharded_ = false;
  CheckpointIndex index_;  // sharded: the pieces; whole: one whole piece per tensor
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // opened on first use
};

}  // namespace lattice::train
