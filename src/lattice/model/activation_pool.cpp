// ActivationPool: see activation_pool.hpp.
#include "lattice/model/activation_pool.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/model/transformer.hpp"

namespace lattice::model {

StageActivations& ActivationPool::acquire() {
  StageActivations* set = nullptr;
  if (!idle_.empty()) {
    set = idle_.back();
    idle_.pop_back();
  } else {
    sets_.push_back(std::make_unique<StageActivations>(model_.make_activations()));
    set = sets_.back().get();
  }
  peak_in_use_ = std::max(peak_in_use_, in_use());
  return *set;
}

void ActivationPool::give_back(StageActivations& set, bool free) {
  const bool ours = std::any_of(sets_.begin(), sets_.end(),
                                [&](const auto& owned) { return owned.get() == &set; });
  const bool idle = std::find(idle_.begin(), idle_.end(), &set) != idle_.end();
  check(ours && !idle,
        "ActivationPool::give_back of a set this pool did not hand out (or gave "
        "back twice): internal error");
  check(!set.weight_gradients_pending,
        "an activation set was given back with its weight gradients still pending: run "
        "backward_stage_weight first");
  if (free) set.release();
  idle_.push_back(&set);
}

void ActivationPool::free_unused() {
  for (StageActivations* set : idle_) set->release();
}

}  // namespace lattice::model
