// Fuzz target: tiktoken .tiktoken rank files from memory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_tokenizer_common.hpp"
#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    auto tokenizer = lattice::data::make_bpe_tokenizer(
        lattice::data::parse_tiktoken(input, "fuzz.tiktoken"), "fuzz.tiktoken");
    lattice::fuzz::exercise(*tokenizer);
  } catch (const lattice::Error&) {
  }
  return 0;
}
