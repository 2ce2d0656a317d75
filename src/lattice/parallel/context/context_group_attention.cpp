// The shared part of the context-parallel attentions: see context_group_attention.hpp.
#include "lattice/parallel/context/context_group_attention.hpp"

#include <utility>

#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {

std::vector<model::PositionRun> ContextGroupAttention::runs(int64_t local_len) const {
  return balanced_runs(local_len, cp_.size(), cp_.rank());
}

double ContextGroupAttention::take_wait_seconds() {
  return std::exchange(wait_seconds_, 0.0);
}

}  // namespace lattice::parallel
