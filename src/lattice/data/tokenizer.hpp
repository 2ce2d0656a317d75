// Tokenizer: the interface every tokenizer implements (text -> ids -> bytes), the byte-level
// tokenizer (one id per byte), and load_tokenizer, which builds one from a configuration string.
// Decoding returns raw bytes: a sequence ending inside a UTF-8 character decodes to its partial
// bytes, and StreamingDecoder holds such a tail back until the character completes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lattice::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of `text`. Special tokens (e.g. "<|endoftext|>") are recognised only when
  // allow_special is true; otherwise they are encoded as ordinary text.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const = 0;
  // The bytes `ids` stand for (not necessarily valid UTF-8). Throws lattice::Error naming an id
  // outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Every id is in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  // The end-of-text token that separates documents, when the tokenizer has one.
  virtual std::optional<int32_t> end_of_text() const = 0;
  // A short description for logs ("byte", "bpe gpt2 (50257)").
  virtual std::string name() const = 0;
};

// One token per byte (vocabulary 256, no end-of-text token).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::string name() const override { return "byte"; }
};

// Builds a tokenizer from `spec` (formats: tokenizer_files.hpp, docs/tokenizer.md):
//   "byte"                      one token per byte
//   "<path>/tokenizer.json"     Hugging Face (any *.json not named encoder.json / vocab.json)
//   "<path>/x.tiktoken"         tiktoken ranks ("tiktoken:<path>" for any file name)
//   "<path>/encoder.json"       GPT-2, with vocab.bpe beside it
//   "<path>/vocab.json"         Hugging Face, with merges.txt beside it
//   "<dir>"                     the first of tokenizer.json, encoder.json + vocab.bpe,
//                               vocab.json + merges.txt found in it
// Throws lattice::Error naming the spec and the fix.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// Decodes a stream of ids for printing: bytes of an incomplete UTF-8 character at the end are held
// back until the ids that complete it arrive (flush() returns them regardless).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Text that is ready to print after appending `id`.
  std::string push(int32_t id);
  // Everything still held back.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace lattice::data
