// BpeTrainer: learns a byte-level BPE (GPT-2 style) from text. Text is split with the same
// pre-tokenizer the tokenizer uses; starting from the 256 bytes (id = byte value), the most
// frequent adjacent pair of symbols is merged, over and over, until the vocabulary (bytes + merges
// + special tokens) reaches the target size or no pair occurs min_frequency times. Ties go to the
// pair of smaller (left id, right id): training is deterministic. Special tokens take the last ids.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lattice/data/bpe_model.hpp"
#include "lattice/data/pretokenizer.hpp"

namespace lattice::data {

struct BpeTrainerOptions {
  int64_t vocab_size = 4096;  // bytes + merges + special tokens
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  int64_t min_frequency = 2;  // a pair seen fewer times is not merged
  std::string pattern{kGpt2Pattern};
};

class BpeTrainer {
 public:
  // Throws lattice::Error when the target cannot hold the 256 bytes and the special tokens.
  explicit BpeTrainer(BpeTrainerOptions options);

  // Adds the pieces of `text` to the counts (special-token strings in the text count as text).
  void add_text(std::string_view text);
  // Reads and adds each file; throws lattice::Error naming a file that cannot be read.
  void add_files(const std::vector<std::filesystem::path>& files);

  // Learns the merges from everything added so far. `on_progress(merges done, merges wanted)`
  // is called now and then when given.
  BpeModel train(const std::function<void(int64_t, int64_t)>& on_progress = {}) const;

  int64_t pieces_counted() const { return pieces_counted_; }

 private:
  BpeTrainerOptions options_;
  std::unique_ptr<Pretokenizer> pretokenizer_;
  std::unordered_map<std::string, int64_t> piece_counts_;
  int64_t pieces_counted_ = 0;
};

}  // namespace lattice::data
