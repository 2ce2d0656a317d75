// The activation memory one rank of a training config holds at its peak (model/
// activation_memory.hpp's formula on this config's model, precision, checkpointing, micro-batch,
// tensor-parallel shards and context-parallel share of each sequence), and the check of
// training.activation_memory_limit_mb against it. `lattice estimate memory --config` prints it;
// the trainer refuses a run over the limit before it allocates anything.
#pragma once

#include "lattice/model/activation_memory.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

// One tp rank's (every rank's are the same size) of a run without pipeline parallelism, with the
// calling thread's OpenMP thread count as the kernels' (the fused head keeps a partial per thread).
model::ActivationMemory estimate_trainer_activations(const TrainConfig& config);

// Throws lattice::Error (one line: the estimate, the limit and the fixes) when the config sets
// training.activation_memory_limit_mb and its estimate exceeds it; nothing when the limit is 0.
void check_activation_memory_limit(const TrainConfig& config);

}  // namespace lattice::train
