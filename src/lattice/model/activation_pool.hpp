// ActivationPool: the activation sets of one stage for the microbatches in flight (a pipeline
// schedule's forwards run ahead of their backwards). acquire() hands out a set — one given back
// earlier, whose tensors are reused by the next forward of the same shape, or a new one —
// and give_back() returns it. Every tensor in the sets is counted as activations by the model's
// MemoryTracker, so the tracker's peak is the schedule's activation peak.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lattice/model/stage_activations.hpp"

namespace lattice::model {

class Transformer;

class ActivationPool {
 public:
  explicit ActivationPool(const Transformer& model) : model_(model) {}

  StageActivations& acquire();
  // Returns a set handed out by acquire(); its tensors stay allocated for reuse unless `free`.
  void give_back(StageActivations& set, bool free = false);
  // Frees the tensors of every set not in use.
  void free_unused();

  int in_use() const { return static_cast<int>(sets_.size() - idle_.size()); }
  int peak_in_use() const { return peak_in_use_; }

 private:
  const Transformer& model_;
  std::vector<std::unique_ptr<StageActivations>> sets_;
  std::vector<StageActivations*> idle_;
  int peak_in_use_ = 0;
};

}  // namespace lattice::model
