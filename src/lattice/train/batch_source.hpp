// BatchSource: where the trainer's batches come from — the configured corpus (split into training
// and validation), this data-parallel rank's share of every global batch, and the position that
// checkpoints save so a resumed run reads the same next batch. Each call to next() consumes one
// micro-batch of the global stream: rank r of n takes samples [r·batch, (r+1)·batch) of the
// n·batch samples drawn, so n ranks together read exactly what one rank with an n-times larger
// micro-batch reads.
#pragma once

#include <cstdint>
#include <memory>

#include "lattice/data/byte_corpus.hpp"
#include "lattice/data/window_sampler.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

class BatchSource {
 public:
  BatchSource(const TrainConfig& config, int dp_rank = 0, int dp_size = 1);
  ~BatchSource();

  // Every token id is in [0, vocab_size()).
  int64_t vocab_size() const;
  // Fills inputs and targets [batch, seq_len] with this rank's part of the next micro-batch.
  void next(int32_t* inputs, int32_t* targets, int64_t batch);
  bool has_validation() const { return val_sampler_ != nullptr; }
  // Batch `index` of the fixed validation set (the same samples on every call, on every rank).
  void validation_batch(int64_t index, int32_t* inputs, int32_t* targets, int64_t batch) const;

  // Samples of the global stream consumed so far (what checkpoints store).
  int64_t position() const { return train_sampler_->position(); }
  void set_position(int64_t position) { train_sampler_->set_position(position); }

 private:
  int64_t seq_len_;
  int dp_rank_, dp_size_;
  std::unique_ptr<data::ByteCorpus> corpus_;
  std::unique_ptr<data::WindowSampler> train_sampler_, val_sampler_;
};

}  // namespace lattice::train
