// Fuzz target: encoding arbitrary bytes (invalid UTF-8 included) then decoding must give the same
// bytes, with and without special tokens, for a tokenizer with merges (trained here on a fixed
// text), the same vocabulary as tiktoken-style ranks, and GPT-2's when LATTICE_GPT2_DIR names a
// directory with encoder.json + vocab.bpe.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "fuzz_tokenizer_common.hpp"
#include "lattice/data/bpe_trainer.hpp"
#include "lattice/data/tokenizer_files.hpp"

namespace {

std::vector<std::unique_ptr<lattice::data::Tokenizer>> make_tokenizers() {
  std::vector<std::unique_ptr<lattice::data::Tokenizer>> tokenizers;
  lattice::data::BpeTrainerOptions options;
  options.vocab_size = 400;
  lattice::data::BpeTrainer trainer(options);
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += "The quick brown fox's 123 jumps — naïve café 😀 over the lazy dog.\n\t  ";
  trainer.add_text(text);
  lattice::data::BpeModel model = trainer.train();
  tokenizers.push_back(std::make_unique<lattice::data::BpeTokenizer>(model));
  model.merges.clear();  // tiktoken-style: ranks = ids
  tokenizers.push_back(std::make_unique<lattice::data::BpeTokenizer>(model));
  if (const char* dir = std::getenv("LATTICE_GPT2_DIR"))
    tokenizers.push_back(lattice::data::load_tokenizer(dir));
  return tokenizers;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizers = make_tokenizers();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const auto& tokenizer : tokenizers) {
    lattice::fuzz::require_round_trip(*tokenizer, input, false);
    lattice::fuzz::require_round_trip(*tokenizer, input, true);
  }
  return 0;
}
