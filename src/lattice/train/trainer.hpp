// Trainer: the single-rank training loop — batches from the corpus, forward and backward over the
// micro-batches of a step (gradient accumulation), global-norm clipping, AdamW with the LR
// schedule, periodic validation, metrics and checkpoints, and bit-identical resumption.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/batch_source.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

struct TrainResult {
  std::vector<double> losses;  // training loss of every step run
  std::vector<double> grad_norms;
  double final_val_loss = 0;
  int64_t first_step = 1;  // 1 + the step resumed from
  double tokens_per_second = 0;
};

class Trainer {
 public:
  explicit Trainer(TrainConfig config);
  ~Trainer();
  // Runs steps until training.steps; prints the metric lines; writes JSONL and checkpoints.
  TrainResult run();

  model::Transformer& model() { return *model_; }
  const TrainConfig& config() const { return config_; }
  // Mean validation loss over validation.batches fixed batches.
  double validation_loss();

 private:
  TrainConfig config_;
  MemoryTracker tracker_;
  std::unique_ptr<kernels::MatmulEngine> matmul_;
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<optim::AdamWOptimizer> optimizer_;
  int64_t start_step_ = 0;
};

}  // namespace lattice::train
