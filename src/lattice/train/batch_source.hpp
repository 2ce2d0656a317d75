// BatchSource: where the trainer's batches come from — the configured data (token files named by
// data.dataset, or text files read as bytes from data.train_files) split into training and
// validation, this data-parallel rank's share of every global batch, and the position that
// checkpoints save so a resumed run reads the same next batch. Each call to next() consumes one
// micro-batch of the global stream: rank r of n takes samples [r·batch, (r+1)·batch) of the
// n·batch samples drawn, so n ranks together read exactly what one rank with an n-times larger
// micro-batch reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "lattice/data/byte_corpus.hpp"
#include "lattice/data/shuffled_window_loader.hpp"
#include "lattice/data/token_dataset.hpp"
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
  bool has_validation() const { return has_validation_; }
  // Batch `index` of the fixed validation set (the same samples on every call, on every rank).
  void validation_batch(int64_t index, int32_t* inputs, int32_t* targets, int64_t batch) const;

  // Samples of the global stream consumed so far (what checkpoints store).
  int64_t position() const { return position_; }
  void set_position(int64_t position);

  // One line for logs: what the batches are read from.
  const std::string& description() const { return description_; }

 private:
  void train_sample(int64_t n, int32_t* inputs, int32_t* targets) const;
  void validation_sample(int64_t n, int32_t* inputs, int32_t* targets) const;

  int64_t seq_len_;
  int dp_rank_, dp_size_;
  int64_t position_ = 0;
  bool has_validation_ = false;
  std::string description_;
  // Text files as bytes (data.train_files) ...
  std::unique_ptr<data::ByteCorpus> corpus_;
  std::unique_ptr<data::WindowSampler> byte_train_, byte_val_;
  // ... or token files (data.dataset).
  data::TokenDataset tokens_;
  int64_t token_vocab_ = 0;
  std::unique_ptr<data::ShuffledWindowLoader> token_train_, token_val_;
};

}  // namespace lattice::train
