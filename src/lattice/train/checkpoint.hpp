// Single-rank checkpoints: <run_dir>/checkpoints/step_<N>/ holding model.safetensors (weights under
// their Hugging Face names, the model configuration and every parameter's placement in the
// metadata), optimizer.safetensors (AdamW moments, the same placements), state.json (step, data
// position, seed) and config.toml. The placements ("lattice.placements": name -> logical shape,
// shard {dim, index, count}, replicated axes) say which slice of which logical tensor each stored
// tensor is; a load refuses placements that differ from the model's (resharding comes later). Each
// checkpoint directory is staged under a temporary name and renamed into place, and the `latest`
// pointer is replaced atomically after it, so a crash never leaves a half-written checkpoint as the
// latest.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"

namespace lattice::train {

struct TrainerState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_consumed = 0;  // the training sampler's position
  uint64_t seed = 0;
};

// Writes a checkpoint for `state.step` and points `latest` at it; keeps the newest `keep_latest`.
// Returns the checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest);

// The directory `latest` points at under run_dir/checkpoints, or "" when the run has none.
std::string latest_checkpoint(const std::string& run_dir);
// Accepts a checkpoint directory or a run directory (then its latest checkpoint).
std::string resolve_checkpoint(const std::string& path);

// The model configuration stored in a checkpoint.
model::ModelConfig read_checkpoint_model_config(const std::string& checkpoint_dir);

// Loads weights (and, when optimizer is not null, the AdamW state) into a model built with the same
// configuration; returns the trainer state. Every mismatch or damage is one clear Error.
TrainerState load_checkpoint(const std::string& checkpoint_dir, model::Transformer& model,
                             optim::AdamWOptimizer* optimizer);

}  // namespace lattice::train
