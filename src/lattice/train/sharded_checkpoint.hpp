// The sharded checkpoint writer: every rank writes only what it owns — the runs of its parameter
// stores that its ZeRO shard holds, its tensor-parallel slices (the tensors its tp group holds
// whole: tp rank 0), its pipeline stages and its experts — into its own safetensors files, weights
// and AdamW moments apart; nothing is gathered through one rank. World rank 0 then writes
// index.json (checkpoint_index.hpp: every logical tensor, its pieces and their CRC-32C, checked to
// cover every element once), state.json (step, data position, seed, optimizer steps) and
// config.toml, and publishes the directory atomically (io/atomic_file.hpp: staged, renamed, the
// `latest` pointer replaced after it). Any rank's failure fails the save on every rank, leaving
// the previous checkpoint as the latest. The ranks' files may be written in the background
// (ShardedCheckpointWriter) while training goes on from a snapshot of the state.
//
// Files of rank r of N: model-rank-<r>-of-<N>.safetensors and optimizer-rank-<r>-of-<N>.safetensors
// (exp_avg/<name> and exp_avg_sq/<name>, and any further states of the sources); with one rank,
// model.safetensors and optimizer.safetensors, which then hold every tensor whole under its own
// name.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/train/checkpoint_reader.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::train {

// One parameter store of this rank and what of it this rank writes.
struct CheckpointSource {
  const model::ParameterStore* store = nullptr;
  const float* values = nullptr;  // laid out as the store's values, whole over the batch group
  // Flat element ranges [begin, end) of the store this rank writes (the parameters' parts inside
  // them; alignment gaps are skipped).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  // Copies the AdamW moments of the flat range [begin, end) (inside one of `ranges`).
  std::function<void(int64_t begin, int64_t end, float* exp_avg, float* exp_avg_sq)> moments;
  // Further per-parameter states laid out as the store's values, whole on this rank (DiLoCo's
  // "diloco_anchor/" and "diloco_momentum/"), written beside the moments under prefix + name.
  std::vector<std::pair<std::string, const float*>> states;
  // This rank's index in its tensor-parallel group: a parameter the group holds whole (not a
  // tensor-parallel slice) is written by its rank 0 only.
  int tp_rank = 0;
};

struct CheckpointContents {
  std::string run_dir;
  model::ModelConfig config;
  TrainerState state;
  int64_t optimizer_steps = 0;
  std::string config_toml;
  int64_t keep_latest = 2;
  std::string layout;  // the writing layout, for the index (e.g. "dp2 tp2 pp1 cp1 ep1 zero1")
};

// One rank's side of saving sharded checkpoints, one at a time. start() snapshots what this rank
// owns (copies of its pieces' weights and moments, so training may go on changing them) and writes
// its files, in the background or before returning; finish() publishes the checkpoint once every
// rank's files are written. Both are collective over `world`, called by every rank at the same
// points (pending() is the same on every rank). A kill at any moment leaves at most an unpublished
// staging directory: the previous checkpoint stays the latest.
class ShardedCheckpointWriter {
 public:
  explicit ShardedCheckpointWriter(comm::Communicator& world);
  // Waits for a background write still running (its checkpoint is left unpublished).
  ~ShardedCheckpointWriter();
  ShardedCheckpointWriter(const ShardedCheckpointWriter&) = delete;
  ShardedCheckpointWriter& operator=(const ShardedCheckpointWriter&) = delete;

  // Starts the checkpoint of `contents` from this rank's `sources`. Throws on every rank when rank
  // 0 cannot open the staging directory, or when a save is still pending (finish it first).
  void start(const CheckpointContents& contents, std::span<const CheckpointSource> sources,
             bool in_background);
  bool pending() const { return pending_; }
  // Publishes the pending checkpoint once every rank's files are written: with `wait`, blocks
  // until then; without, returns "" when some rank is still writing (one small all-reduce).
  // Returns the directory. Throws on every rank when a rank could not write (the rank's own error
  // there, one line naming the failure elsewhere); the previous checkpoint stays the latest.
  std::string finish(bool wait);

  // The last start()'s seconds on this rank: copying the pieces out, and writing the files.
  double snapshot_seconds() const { return snapshot_seconds_; }
  double write_seconds() const { return write_seconds_; }
  // Tests only: this rank kills its process (SIGKILL) halfway through writing its files.
  void kill_while_writing() { kill_while_writing_ = true; }

 private:
  struct Pending;
  comm::Communicator& world_;
  bool pending_ = false;
  std::unique_ptr<Pending> state_;
  double snapshot_seconds_ = 0, write_seconds_ = 0;
  bool kill_while_writing_ = false;
};

// A whole save (start, then finish with waiting): collective over `world` (every rank of the run,
// each with its sources). Returns the checkpoint directory on every rank once it is published.
std::string save_sharded_checkpoint(const CheckpointContents& contents,
                                    std::span<const CheckpointSource> sources,
                                    comm::Communicator& world);

// "step_00001200": the directory name of a step's checkpoint.
std::string checkpoint_step_name(int64_t step);
// The published checkpoint directories under run_dir/checkpoints, oldest step first (staging
// folders left out).
std::vector<std::string> published_checkpoints(const std::string& run_dir);

}  // namespace lattice::train
