// The tokenizer side of Hugging Face interop: see hf_tokenizer.hpp.
#include "lattice/train/hf_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The Hugging Face files that describe a tokenizer's special tokens beside its vocabulary.
constexpr const char* kTokenizerConfigFiles[] = {"tokenizer_config.json",
                                                 "special_tokens_map.json"};

void add_config_files(const fs::path& dir, std::vector<HfTokenizerFile>& files) {
  for (const char* name : kTokenizerConfigFiles)
    if (fs::exists(dir / name)) files.push_back({dir / name, name});
}

// A JSON file's object, or an empty object when the file does not parse.
json json_object_or_empty(const fs::path& path) {
  try {
    json j = json::parse(read_file_text(path.string()));
    if (j.is_object()) return j;
  } catch (const std::exception&) {
  }
  return json::object();
}

// The text of a special token entry: "<pad>" or {"content": "<pad>", ...}; "" otherwise.
std::string token_text(const json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_object() && entry.contains("content") && entry["content"].is_string())
    return entry["content"].get<std::string>();
  return "";
}

// The id of `text` when it encodes (special tokens allowed) to exactly one token.
std::optional<int32_t> single_token(const data::Tokenizer& tokenizer, const std::string& text) {
  if (text.empty()) return std::nullopt;
  const std::vector<int32_t> ids = tokenizer.encode(text, true);
  if (ids.size() != 1) return std::nullopt;
  return ids[0];
}

// An id field of config.json / generation_config.json: an integer or a list (its first).
std::optional<int32_t> id_field(const json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  const json& value = j[key];
  const json& first = value.is_array() && !value.empty() ? value[0] : value;
  if (first.is_number_integer()) return first.get<int32_t>();
  return std::nullopt;
}

}  // namespace

std::vector<HfTokenizerFile> hf_export_tokenizer_files(const std::string& spec) {
  if (spec.empty() || spec == "byte") return {};
  fs::path path(spec.rfind("tiktoken:", 0) == 0 ? spec.substr(9) : spec);
  check(fs::exists(path), "Hugging Face export: the tokenizer " + spec +
                              " does not exist: pass --tokenizer with its path, or --tokenizer "
                              "byte to export without tokenizer files");
  if (fs::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "encoder.json", "vocab.json"})
      if (fs::exists(path / name)) return hf_export_tokenizer_files((path / name).string());
    throw Error("Hugging Face export: " + spec +
                " holds no tokenizer.json, encoder.json or vocab.json: pass the tokenizer's path");
  }
  const std::string name = path.filename().string();
  const fs::path dir = path.parent_path();
  std::vector<HfTokenizerFile> files;
  if (name == "encoder.json") return {{path, "vocab.json"}, {dir / "vocab.bpe", "merges.txt"}};
  if (name == "vocab.json") {
    files = {{path, "vocab.json"}, {dir / "merges.txt", "merges.txt"}};
  } else if (path.extension() == ".json") {
    files = {{path, "tokenizer.json"}};
  } else {
    throw Error("Hugging Face export: the tokenizer " + spec +
                " has no Hugging Face form (tiktoken ranks): pass --tokenizer byte to export "
                "without tokenizer files");
  }
  add_config_files(dir, files);
  return files;
}

std::vector<HfTokenizerFile> hf_directory_tokenizer_files(const fs::path& dir) {
  std::vector<HfTokenizerFile> files;
  if (fs::exists(dir / "tokenizer.json"))
    files = {{dir / "tokenizer.json", "tokenizer.json"}};
  else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    files = {{dir / "vocab.json", "vocab.json"}, {dir / "merges.txt", "merges.txt"}};
  else
    return {};
  add_config_files(dir, files);
  return files;
}

std::unique_ptr<data::Tokenizer> load_tokenizer_for_model(const std::string& spec,
                                                          int64_t model_vocab_size,
                                                          const std::string& context,
                                                          const std::string& fix) {
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::load_tokenizer(spec);
  } catch (const Error& e) {
    throw Error(context + ": the tokenizer does not load (" + e.what() + "): " + fix);
  }
  check(tokenizer->vocab_size() <= model_vocab_size,
        context + ": the tokenizer " + spec + " has " + std::to_string(tokenizer->vocab_size()) +
            " tokens but the model's vocab_size is " + std::to_string(model_vocab_size) +
            " (ids from " + std::to_string(model_vocab_size) + " on have no embedding): " + fix);
  return tokenizer;
}

HfSpecialTokenIds hf_special_token_ids(const data::Tokenizer& tokenizer,
                                       const fs::path& config_dir) {
  HfSpecialTokenIds ids;
  ids.eos = tokenizer.end_of_text();
  ids.bos = single_token(tokenizer, "<|begin_of_text|>");
  if (!ids.bos) ids.bos = ids.eos;
  for (const char* name : kTokenizerConfigFiles) {
    const json j = json_object_or_empty(config_dir / name);
    if (j.contains("pad_token")) {
      ids.pad = single_token(tokenizer, token_text(j["pad_token"]));
      if (ids.pad) break;
    }
  }
  return ids;
}

std::optional<int32_t> hf_declared_eos(const fs::path& dir) {
  for (const char* name : {"generation_config.json", "config.json"})
    if (fs::exists(dir / name))
      if (auto eos = id_field(json_object_or_empty(dir / name), "eos_token_id")) return eos;
  return std::nullopt;
}

}  // namespace lattice::train
