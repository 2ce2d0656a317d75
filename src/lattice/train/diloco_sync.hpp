// DilocoSync: DiLoCo on one trainer rank (Douillard et al. 2023). Each replica group trains on its
// own (any layout, its own AdamW); after every diloco.inner_steps steps each rank averages the
// parameters it holds with the ranks at the same place of the other groups (a GlooLink of M
// members per rank position, over TCP, meeting at replica.store) and applies the outer step
// (replica::OuterOptimizer) to them, so every group continues from the same parameters. Every
// stage's whole values take part (ZeRO-3 gathers them first and keeps its shards of the result):
// each rank exchanges 2·(M-1)/M of its 4Ψ bytes per outer step, and holds the anchor and the
// momentum (8Ψ) in host memory beside its model (the values are staged through the host:
// Gloo sends host buffers, whatever the backend).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lattice/parallel/replica/gloo_link.hpp"
#include "lattice/parallel/replica/outer_optimizer.hpp"
#include "lattice/train/step_runner.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

class DilocoSync {
 public:
  // Anchors the outer state at the runner's current parameters; with replica.groups > 1 joins the
  // link of this rank's position and checks that every group runs the same model and layout.
  // Collective over this group's ranks (ZeRO-3 gathers) and over the groups.
  DilocoSync(const TrainConfig& config, StepRunner& runner, int world_rank);
  ~DilocoSync();

  // After step `step`: at each multiple of diloco.inner_steps the outer step (true), else
  // nothing. Collective like the constructor.
  bool after_step(int64_t step);

  int64_t outer_steps() const;

  // Stage i's outer state, laid out as its store's values, for the checkpoint (states named
  // "diloco_anchor/" and "diloco_momentum/" + parameter name).
  std::vector<std::pair<std::string, const float*>> checkpoint_states(int stage) const;
  // After the trainer resumed from `checkpoint_dir` at `step`: the outer state from it (any layout
  // wrote it); a checkpoint without one (DiLoCo newly switched on) anchors at the resumed
  // parameters with momentum 0, and says so on `printing` ranks.
  void resume(const std::string& checkpoint_dir, int64_t step, bool printing);
  // Bytes this rank has sent to the other groups so far.
  int64_t bytes_sent() const { return link_ ? link_->bytes_sent() : 0; }

 private:
  // Every stage's whole parameters, settled (ZeRO-3 gathers them).
  void settle_whole();
  // `store`'s values copied to host memory (host_), where Gloo sends them and the outer step runs.
  std::vector<float>& host_values(const model::ParameterStore& store);

  const TrainConfig& config_;
  StepRunner& runner_;
  int groups_;
  std::unique_ptr<replica::GlooLink> link_;                      // null with one group
  std::vector<std::unique_ptr<replica::OuterOptimizer>> outer_;  // one per stage
  std::vector<float> host_;  // one stage's values on the host during an outer step
};

// A fingerprint of what every replica group must share: the model, the layout, the batch and the
// DiLoCo settings (the groups' own keys, such as replica.group, left out).
uint64_t replica_fingerprint(const TrainConfig& config);

}  // namespace lattice::train
