// DatasetManifest: the manifest.json that `lattice data prepare` writes beside its llm.c shards —
// the tokenizer (spec as an absolute path, its vocabulary and end-of-text id), the token type, the
// document and token counts of each split and the shard list — and its reader, which checks every
// field and names the file and the field when one is missing or wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lattice::data {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestFormat = "lattice-token-shards";

struct ManifestShard {
  std::string file;   // relative to the dataset directory
  std::string split;  // "train" or "val"
  int64_t tokens = 0;
};

struct DatasetManifest {
  std::string tokenizer;  // the spec the shards were made with ("byte" or an absolute path)
  std::string tokenizer_name;
  int64_t vocab_size = 0;
  std::optional<int32_t> end_of_text;
  std::string token_type = "uint16";  // "uint16" or "uint32"
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<ManifestShard> shards;

  std::string to_json() const;
  // The shard files of `split`, in order.
  std::vector<std::string> files(const std::string& split) const;
};

// `spec` with its path made absolute ("byte" stays; "tiktoken:<path>" keeps its prefix), so that
// a manifest or a run's config.toml names the tokenizer from any working directory.
std::string absolute_tokenizer_spec(const std::string& spec);

// Parses manifest text; `name` is the file named in errors.
DatasetManifest parse_manifest(const std::string& text, const std::string& name);
// Reads `<directory>/manifest.json`.
DatasetManifest read_manifest(const std::string& directory);

}  // namespace lattice::data
