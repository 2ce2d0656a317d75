// BpeModel: the data of a byte-level BPE tokenizer as the files hold it and the trainer produces
// it: ordinary tokens (byte strings with ids), the merges in priority order, special tokens and the
// pre-tokenizer pattern. BpeTokenizer encodes with it; tokenizer_files reads and writes it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lattice/data/pretokenizer.hpp"

namespace lattice::data {

struct BpeToken {
  std::string bytes;  // raw bytes (not the byte-level Unicode spelling of the files)
  int32_t id = 0;
};

struct SpecialToken {
  std::string text;  // matched literally in the input when special tokens are allowed
  int32_t id = 0;
};

struct BpeModel {
  // Every single byte must be among the tokens (byte-level BPE can encode any input).
  std::vector<BpeToken> tokens;
  // Merges (left bytes, right bytes) in priority order, GPT-2 / Hugging Face style. Empty means
  // tiktoken style: adjacent parts merge into the token of lowest id their concatenation names.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<SpecialToken> special_tokens;
  // A piece equal to a token is that token even where the merges would split it (tiktoken's
  // rule; Hugging Face's ignore_merges). Otherwise a piece is looked up whole only where the
  // merges produce the token.
  bool ignore_merges = false;
  std::string pattern{kGpt2Pattern};
  std::string name = "bpe";  // for logs: where the model came from
};

}  // namespace lattice::data
