// BatchSource: see batch_source.hpp.
#include "lattice/train/batch_source.hpp"

#include "lattice/core/error.hpp"

namespace lattice::train {

BatchSource::BatchSource(const TrainConfig& config, int dp_rank, int dp_size)
    : seq_len_(config.seq_len), dp_rank_(dp_rank), dp_size_(dp_size) {
  check(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
        "data-parallel rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size) +
            " is not a valid position");
  corpus_ = std::make_unique<data::ByteCorpus>(
      data::expand_file_patterns(config.train_files, config.exclude), config.val_fraction);
  check(corpus_->train().vocab_size() <= config.model.vocab_size,
        "the byte tokenizer needs model.vocab_size >= 256, got " +
            std::to_string(config.model.vocab_size));
  train_sampler_ =
      std::make_unique<data::WindowSampler>(corpus_->train(), config.seq_len, config.seed);
  if (config.val_freq > 0 && corpus_->validation().size() > config.seq_len)
    val_sampler_ = std::make_unique<data::WindowSampler>(corpus_->validation(), config.seq_len,
                                                         config.seed + 1);
}

BatchSource::~BatchSource() = default;

int64_t BatchSource::vocab_size() const { return corpus_->train().vocab_size(); }

void BatchSource::next(int32_t* inputs, int32_t* targets, int64_t batch) {
  const int64_t first = train_sampler_->position() + dp_rank_ * batch;
  for (int64_t b = 0; b < batch; ++b)
    train_sampler_->sample(first + b, inputs + b * seq_len_, targets + b * seq_len_);
  train_sampler_->set_position(train_sampler_->position() + batch * dp_size_);
}

void BatchSource::validation_batch(int64_t index, int32_t* inputs, int32_t* targets,
                                   int64_t batch) const {
  check(val_sampler_ != nullptr, "no validation split: raise data.val_fraction");
  for (int64_t b = 0; b < batch; ++b)
    val_sampler_->sample(index * batch + b, inputs + b * seq_len_, targets + b * seq_len_);
}

}  // namespace lattice::train
