// BpeTokenizer: byte-level BPE encoding and decoding of a BpeModel. Text is split by the
// pre-tokenizer; each piece becomes one token when BPE would produce exactly that token (a direct
// lookup), otherwise it comes from a cache of earlier pieces or from merging its bytes by rank
// (buffers on the stack; a heap-ordered merge for pieces longer than 256 bytes).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "lattice/data/bpe_model.hpp"
#include "lattice/data/tokenizer.hpp"

namespace lattice::data {

class BpeTokenizer final : public Tokenizer {
 public:
  // Checks the model (ids unique and non-negative, all 256 bytes present, merges made of tokens
  // whose concatenation is a token); throws lattice::Error saying what is wrong.
  explicit BpeTokenizer(BpeModel model);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  std::optional<int32_t> end_of_text() const override;
  std::string name() const override;

  // Appends the ids of one pre-tokenized piece (no special tokens, no splitting) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The ids of the special token `text`, if the model has one.
  std::optional<int32_t> special_token(std::string_view text) const;
  const BpeModel& model() const { return model_; }

 private:
  struct Tables;
  struct Cache;
  BpeModel model_;
  std::unique_ptr<const Tables> tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace lattice::data
