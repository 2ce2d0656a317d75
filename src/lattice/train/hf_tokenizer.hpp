// The tokenizer side of Hugging Face interop: which files of a model directory make its tokenizer
// (tokenizer.json, or GPT-2's BPE form vocab.json + merges.txt, each with tokenizer_config.json and
// special_tokens_map.json when present), which files a Lattice tokenizer spec exports as, the
// special-token ids config.json and generation_config.json carry (bos, eos, pad), and loading a
// tokenizer with the check that every id it makes is one the model's embedding can look up.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lattice/data/tokenizer.hpp"

namespace lattice::train {

// A tokenizer file and its name inside a Hugging Face model directory.
struct HfTokenizerFile {
  std::filesystem::path source;
  std::string name;
};

// The files the tokenizer `spec` (a path to tokenizer.json, encoder.json / vocab.json, or a
// directory holding them) exports as: tokenizer.json, or vocab.json + merges.txt (GPT-2's
// encoder.json + vocab.bpe renamed), with tokenizer_config.json and special_tokens_map.json when
// they lie beside a tokenizer.json or vocab.json. "byte" or "": none. A tiktoken spec, which has no
// Hugging Face form, and a missing path are one Error line each.
std::vector<HfTokenizerFile> hf_export_tokenizer_files(const std::string& spec);

// The tokenizer files of the Hugging Face model directory `dir`, in the order load_tokenizer
// prefers them: tokenizer.json when present, else vocab.json + merges.txt, each with
// tokenizer_config.json and special_tokens_map.json when present. Empty when `dir` has neither
// form. The first file is the one to load.
std::vector<HfTokenizerFile> hf_directory_tokenizer_files(const std::filesystem::path& dir);

// Loads the tokenizer `spec` for a model of `model_vocab_size` tokens. A file that does not parse,
// and a tokenizer that makes an id the model's embedding cannot look up (its vocabulary is larger),
// are one Error line each: `context` begins it ("Hugging Face export"), `fix` ends it.
std::unique_ptr<data::Tokenizer> load_tokenizer_for_model(const std::string& spec,
                                                          int64_t model_vocab_size,
                                                          const std::string& context,
                                                          const std::string& fix);

// The special-token ids transformers reads from config.json and generation_config.json.
struct HfSpecialTokenIds {
  std::optional<int32_t> bos, eos, pad;
};

// The ids of `tokenizer` as transformers expects them: eos its end-of-text token; bos its
// <|begin_of_text|> token where it has one (Llama 3), else eos (GPT-2 and Qwen 2 begin with their
// end-of-text token); pad the token that tokenizer_config.json or special_tokens_map.json in
// `config_dir` names as pad_token, when one does and it is one token of `tokenizer`.
HfSpecialTokenIds hf_special_token_ids(const data::Tokenizer& tokenizer,
                                       const std::filesystem::path& config_dir);

// The eos that transformers' generate stops at for the model directory `dir`:
// generation_config.json's eos_token_id, else config.json's (the first of a list); nullopt when
// neither names one or a file does not parse.
std::optional<int32_t> hf_declared_eos(const std::filesystem::path& dir);

}  // namespace lattice::train
