// TokenDataset: a training and a validation token stream opened from token files — a directory
// made by `lattice data prepare` (manifest.json + llm.c shards), llm.c shard globs, or a Megatron
// prefix — every file memory-mapped and checked against the vocabulary when it opens. Several
// files of one split read as one stream, in order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lattice/data/dataset_manifest.hpp"
#include "lattice/data/token_source.hpp"

namespace lattice::data {

// Token sources read back to back as one.
class ConcatenatedTokens final : public TokenSource {
 public:
  explicit ConcatenatedTokens(std::vector<std::unique_ptr<TokenSource>> parts);
  int64_t size() const override { return starts_.back(); }
  int64_t vocab_size() const override { return vocab_size_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  std::vector<std::unique_ptr<TokenSource>> parts_;
  std::vector<int64_t> starts_;  // starts_[i] = first token of part i; back() = total
  int64_t vocab_size_ = 0;
};

enum class TokenFormat { automatic, prepared, llmc, megatron };
// "auto", "prepared", "llmc", "megatron"; throws naming data.format and the valid values.
TokenFormat parse_token_format(const std::string& name);

struct TokenDataset {
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> validation;  // null when the dataset has no validation split
  std::optional<DatasetManifest> manifest;  // for prepared directories
  std::string description;                  // for logs: "prepared dir X (N train tokens)"
};

// Opens `spec` (a prepared directory, llm.c shard globs, or a Megatron prefix; see docs/data.md).
// llm.c globs: files whose name contains "val" form the validation split (llm.c's naming).
// `val_spec`, when not empty, names the validation data instead (same formats). Every id is checked
// to be below vocab_size.
TokenDataset open_token_dataset(const std::string& spec, TokenFormat format, int64_t vocab_size,
                                const std::string& val_spec = "");

// The format `spec` has on disk (never `automatic`): a directory with manifest.json is prepared,
// a path with `<spec>.idx` (or ending in .idx/.bin) is Megatron, anything else llm.c globs.
TokenFormat detect_token_format(const std::string& spec);

}  // namespace lattice::data
