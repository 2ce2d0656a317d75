// Tokenizer files: reading and writing the byte-level BPE formats users already have.
//   - GPT-2 `encoder.json` + `vocab.bpe`, and Hugging Face `vocab.json` + `merges.txt` (the same
//   two
//     formats): token strings in GPT-2's byte-level alphabet; vocabulary entries spelled `<|...|>`
//     become special tokens.
//   - Hugging Face `tokenizer.json`: model.type "BPE" with a ByteLevel pre-tokenizer (or a Split
//     regex followed by ByteLevel without its own regex); added_tokens become special tokens.
//   - tiktoken `.tiktoken` rank files: "<base64 token> <rank>" per line. The pattern and special
//     tokens of OpenAI's r50k_base, p50k_base, cl100k_base and o200k_base are known by file name;
//     other files get GPT-2's pattern and <|endoftext|> after the last rank.
// Every malformed input is one lattice::Error naming the file and what is wrong. The parse_* forms
// read from memory (fuzzing); `name` is the file name used in messages.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "lattice/data/bpe_model.hpp"
#include "lattice/data/bpe_tokenizer.hpp"

namespace lattice::data {

BpeModel parse_vocab_and_merges(std::string_view vocab_json, std::string_view merges_txt,
                                const std::string& vocab_name, const std::string& merges_name);
BpeModel parse_tokenizer_json(std::string_view text, const std::string& name);
BpeModel parse_tiktoken(std::string_view text, const std::string& name);

BpeModel read_vocab_and_merges(const std::filesystem::path& vocab_json,
                               const std::filesystem::path& merges_txt);
BpeModel read_tokenizer_json(const std::filesystem::path& path);
BpeModel read_tiktoken(const std::filesystem::path& path);

// A tokenizer of `model`; problems the model has (e.g. a missing byte token) are reported as
// errors of the file `name`.
std::unique_ptr<BpeTokenizer> make_bpe_tokenizer(BpeModel model, const std::string& name);

// Writers (the model must have merges for the Hugging Face / GPT-2 forms; tiktoken files take
// ranks = ids of the ordinary tokens). Each throws lattice::Error naming a file it cannot write.
void write_tokenizer_json(const BpeModel& model, const std::filesystem::path& path);
void write_vocab_and_merges(const BpeModel& model, const std::filesystem::path& vocab_json,
                            const std::filesystem::path& merges_txt);
void write_tiktoken(const BpeModel& model, const std::filesystem::path& path);

}  // namespace lattice::data
