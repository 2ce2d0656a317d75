// Training benchmark: times Lattice's training step (forward, backward, clipping, AdamW) on a fixed
// random batch, on one rank or data-parallel over local ranks, and runs the PyTorch peer
// (bench/pytorch_train.py, alone or under DDP) on the same model and batch so the two are measured
// side by side in one invocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lattice/kernels/cpu/precision.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::train {

struct BenchmarkCase {
  std::string label;
  model::ModelConfig model;
  int64_t batch = 8, seq_len = 256;
};

struct ThroughputResult {
  double tokens_per_second = 0;
  double seconds_per_step = 0;
};

// Lattice: `warmup` untimed steps, then `steps` timed ones. With ranks > 1, data parallelism over
// the local backend (ranks as threads, each with 1/ranks of the batch and of the OpenMP threads);
// tokens/s are of the whole batch.
ThroughputResult benchmark_lattice_training(const BenchmarkCase& c, kernels::Precision precision,
                                            int64_t steps, int64_t warmup, int ranks = 1);

// PyTorch peer through `python` running `script` with `threads` threads in all; with ranks > 1,
// DistributedDataParallel over gloo in `ranks` processes of threads / ranks threads each. nullopt
// (with the reason in `why`) when PyTorch cannot run here.
std::optional<ThroughputResult> benchmark_pytorch_training(const BenchmarkCase& c,
                                                           kernels::Precision precision,
                                                           int64_t steps, int64_t warmup,
                                                           int threads, const std::string& python,
                                                           const std::string& script,
                                                           std::string& why, int ranks = 1);

}  // namespace lattice::train
