// Checkpoints: <run_dir>/checkpoints/step_<N>/ holding model.safetensors (weights under their
// Hugging Face names, the model configuration and every parameter's placement in the metadata),
// optimizer.safetensors (AdamW moments, the same placements), state.json (step, data position,
// seed) and config.toml. The placements ("lattice.placements": name -> logical shape, shard {dim,
// index, count[, blocks]}, replicated axes) say which slice of which logical tensor each stored
// tensor is. A tensor-parallel model's checkpoint holds the logical tensors (gathered over its
// tensor-parallel group, placements whole): the bytes a tp = 1 model of the same configuration
// writes, so a one-rank run or `lattice generate` reads it; a load into a tensor-parallel model
// takes each rank's slice of each logical tensor. Any other difference of placements is refused.
// Each checkpoint directory is staged under a temporary name and renamed into place, and the
// `latest` pointer is replaced atomically after it, so a crash never leaves a half-written
// checkpoint as the latest.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::train {

struct TrainerState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_consumed = 0;  // the training sampler's position
  uint64_t seed = 0;
};

// Writes a checkpoint for `state.step` and points `latest` at it; keeps the newest `keep_latest`.
// Returns the checkpoint directory. `optimizer`'s moments are laid out as the model's values (under
// ZeRO: the full state DataParallel::export_state gathers). A model holding tensor-parallel slices
// is refused: use the form with its tensor-parallel group.
std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest);
// A tensor-parallel model's checkpoint. Collective over `tp` (the ranks holding the slices of one
// logical model, rank r slice r): each rank passes its model and its AdamW state; tp rank 0 writes
// the logical tensors, laid out as the tp = 1 model (model::Transformer::declared_only of the
// same configuration and stage), and every rank returns the directory once it is written (or
// throws when rank 0 could not write it). With a group of one rank it is the form above, byte for
// byte.
std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            comm::Communicator& tp);

// The same on a bare parameter store (what the forms above call; tests with hand-made stores):
// `config` is recorded in the metadata, `params` gives the tensors and their placements, and in
// the tensor-parallel form `logical` is the store of the logical tensors (the same names, every
// parameter whole; see parallel::check_logical_store), whose layout and placements are written.
std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest);
std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            const model::ParameterStore& logical, comm::Communicator& tp);

// A checkpoint from buffers laid out as `whole`'s values (a one-rank model's store: every parameter
// whole), the state a pipeline run gathers from its stages (train/pipeline_rank.hpp). Collective
// over `group`: its rank 0 passes the buffers (the others' are not read) and writes, and every rank
// returns the directory once written, or throws when rank 0 could not write it.
std::string save_whole_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                                  const model::ParameterStore& whole, const float* values,
                                  const float* exp_avg, const float* exp_avg_sq,
                                  int64_t optimizer_steps, const TrainerState& state,
                                  const std::string& config_toml, int64_t keep_latest,
                                  comm::Communicator& group);

// The directory `latest` points at under run_dir/checkpoints, or "" when the run has none.
std::string latest_checkpoint(const std::string& run_dir);
// Accepts a checkpoint directory or a run directory (then its latest checkpoint).
std::string resolve_checkpoint(const std::string& path);

// The model configuration stored in a checkpoint.
model::ModelConfig read_checkpoint_model_config(const std::string& checkpoint_dir);

// Loads weights (and, when optimizer is not null, the AdamW state) into a model built with the same
// configuration; returns the trainer state. A parameter the model holds a slice of, stored whole
// (a logical checkpoint), gets its slice; otherwise the stored placement must be the model's.
// Needs no communication: every rank reads the files. Every mismatch or damage is one clear Error.
TrainerState load_checkpoint(const std::string& checkpoint_dir, model::Transformer& model,
                             optim::AdamWOptimizer* optimizer);
// The same into a bare parameter store, the checkpoint's configuration checked against `config`.
TrainerState load_checkpoint(const std::string& checkpoint_dir, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer);

}  // namespace lattice::train
