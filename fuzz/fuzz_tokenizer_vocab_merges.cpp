// Fuzz target: GPT-2 encoder.json + vocab.bpe / Hugging Face vocab.json + merges.txt from memory.
// The input is the vocabulary JSON, a 0 byte, then the merges text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_tokenizer_common.hpp"
#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view vocab = input.substr(0, split);
  const std::string_view merges =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  try {
    auto tokenizer = lattice::data::make_bpe_tokenizer(
        lattice::data::parse_vocab_and_merges(vocab, merges, "vocab.json", "merges.txt"),
        "vocab.json");
    lattice::fuzz::exercise(*tokenizer);
  } catch (const lattice::Error&) {
  }
  return 0;
}
