// BatchSource: see batch_source.hpp.
#include "lattice/train/batch_source.hpp"

#include "lattice/core/error.hpp"

namespace lattice::train {

BatchSource::BatchSource(const TrainConfig& config, int dp_rank, int dp_size)
    : seq_len_(config.training.seq_len), dp_rank_(dp_rank), dp_size_(dp_size) {
  check(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
        "data-parallel rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size) +
            " is not a valid position");
  if (!config.data.dataset.empty()) {
    tokens_ =
        data::open_token_dataset(config.data.dataset, data::parse_token_format(config.data.format),
                                 config.model.vocab_size, config.data.val_dataset);
    token_vocab_ = tokens_.manifest ? tokens_.manifest->vocab_size : config.model.vocab_size;
    token_train_ = std::make_unique<data::ShuffledWindowLoader>(
        *tokens_.train, config.training.seq_len, config.training.seed, true,
        "the training split of data.dataset '" + config.data.dataset + "'");
    if (config.validation.freq > 0 && tokens_.validation &&
        tokens_.validation->size() > config.training.seq_len)
      token_val_ = std::make_unique<data::ShuffledWindowLoader>(
          *tokens_.validation, config.training.seq_len, config.training.seed + 1, false,
          "the validation split");
    has_validation_ = token_val_ != nullptr;
    description_ = tokens_.description;
    return;
  }
  check(!config.data.train_files.empty(),
        "no training data: set data.dataset (token files from `lattice data prepare`) or "
        "data.train_files (text read as bytes)");
  corpus_ = std::make_unique<data::ByteCorpus>(
      data::expand_file_patterns(config.data.train_files, config.data.exclude, "data.train_files"),
      config.data.val_fraction);
  check(corpus_->train().vocab_size() <= config.model.vocab_size,
        "the byte tokenizer needs model.vocab_size >= 256, got " +
            std::to_string(config.model.vocab_size));
  byte_train_ = std::make_unique<data::WindowSampler>(corpus_->train(), config.training.seq_len,
                                                      config.training.seed);
  if (config.validation.freq > 0 && corpus_->validation().size() > config.training.seq_len)
    byte_val_ = std::make_unique<data::WindowSampler>(
        corpus_->validation(), config.training.seq_len, config.training.seed + 1);
  has_validation_ = byte_val_ != nullptr;
  description_ = std::to_string(corpus_->file_count()) + " text files as bytes (" +
                 std::to_string(corpus_->total_bytes()) + " bytes)";
}

BatchSource::~BatchSource() = default;

int64_t BatchSource::vocab_size() const {
  return corpus_ ? corpus_->train().vocab_size() : token_vocab_;
}

void BatchSource::set_position(int64_t position) {
  check(position >= 0,
        "a data position (samples consumed) must not be negative, got " + std::to_string(position));
  position_ = position;
}

void BatchSource::train_sample(int64_t n, int32_t* inputs, int32_t* targets) const {
  if (token_train_)
    token_train_->sample(n, inputs, targets);
  else
    byte_train_->sample(n, inputs, targets);
}

void BatchSource::validation_sample(int64_t n, int32_t* inputs, int32_t* targets) const {
  if (token_val_)
    token_val_->sample(n, inputs, targets);
  else
    byte_val_->sample(n, inputs, targets);
}

void BatchSource::next(int32_t* inputs, int32_t* targets, int64_t batch) {
  const int64_t first = position_ + dp_rank_ * batch;
  for (int64_t b = 0; b < batch; ++b)
    train_sample(first + b, inputs + b * seq_len_, targets + b * seq_len_);
  position_ += batch * dp_size_;
}

void BatchSource::validation_batch(int64_t index, int32_t* inputs, int32_t* targets,
                                   int64_t batch) const {
  check(has_validation_,
        "no validation split: raise data.val_fraction (or prepare the dataset "
        "with --val-fraction)");
  for (int64_t b = 0; b < batch; ++b)
    validation_sample(index * batch + b, inputs + b * seq_len_, targets + b * seq_len_);
}

}  // namespace lattice::train
