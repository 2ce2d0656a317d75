// Checkpoints: <run_dir>/checkpoints/step_<N>/, written sharded (sharded_checkpoint.hpp: every
// rank its own files, index.json mapping each logical tensor to its pieces with their checksums,
// state.json, config.toml; staged and renamed into place, the `latest` pointer replaced after it)
// and read into any layout (checkpoint_reader.hpp assembles each logical tensor; each rank takes
// its slice, and data parallelism its ZeRO shard). The forms here save one parameter store (or a
// tensor-parallel group's stores) and load a model; the trainer saves its whole layout through
// save_sharded_checkpoint directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint_reader.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::train {

// Writes a checkpoint of one rank's model for `state.step` and points `latest` at it; keeps the
// newest `keep_latest`. Returns the checkpoint directory. `optimizer`'s moments are laid out as the
// model's values. A model holding tensor-parallel slices is refused: use the form with its
// tensor-parallel group.
std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest);
// A tensor-parallel model's checkpoint. Collective over `tp` (the ranks holding the slices of one
// logical model): each rank passes its model and its AdamW state and writes its slices (tp rank 0
// also the tensors the group holds whole); every rank returns the directory once it is published.
std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            comm::Communicator& tp);

// The same on a bare parameter store (what the forms above call; tests with hand-made stores):
// `config` is recorded in the index, `params` gives the tensors and their placements.
std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest);
std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            comm::Communicator& tp);

// The directory `latest` points at under run_dir/checkpoints, or "" when the run has none.
std::string latest_checkpoint(const std::string& run_dir);
// The run's checkpoints to resume from, newest first: the one `latest` names (when it names one),
// then every other step_<N> directory by step, descending. Empty when the run has none.
std::vector<std::string> checkpoint_candidates(const std::string& run_dir);
// Removes the staging directories (step_<N>.tmp-<pid>) that saves killed before their publish left
// under run_dir/checkpoints.
void remove_unpublished_checkpoints(const std::string& run_dir);
// Accepts a checkpoint directory or a run directory (then its latest checkpoint).
std::string resolve_checkpoint(const std::string& path);

// The model configuration stored in a checkpoint.
model::ModelConfig read_checkpoint_model_config(const std::string& checkpoint_dir);

// Loads weights (and, when optimizer is not null, the AdamW state) into a model built with the same
// configuration, in any layout: each parameter's logical tensor is read from the checkpoint
// (whatever layout wrote it) and this store's slice taken. Returns the trainer state. Needs no
// communication: every rank reads the files. Every mismatch or damage is one clear Error.
TrainerState load_checkpoint(const std::string& checkpoint_dir, model::Transformer& model,
                             optim::AdamWOptimizer* optimizer);
// The same into a bare parameter store, the checkpoint's configuration checked against `config`.
TrainerState load_checkpoint(const std::string& checkpoint_dir, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer);
// The same from an open checkpoint (several stores of one rank read one index).
TrainerState load_checkpoint(CheckpointReader& reader, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer);
// Reads the state "<prefix><name>" of every parameter of `params` (e.g. "diloco_anchor/") into
// `out`, laid out as the store's values (this store's slices of the logical tensors); false, with
// nothing read, when the checkpoint has no such state.
bool read_parameter_state(CheckpointReader& reader, const std::string& prefix,
                          const model::ParameterStore& params, float* out);

}  // namespace lattice::train
