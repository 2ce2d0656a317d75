// ByteCorpus: text files read as raw bytes, one token per byte (vocabulary 256), split into a
// training part and a validation tail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/data/token_source.hpp"

namespace lattice::data {

// Expands glob patterns to a sorted list of regular files, dropping those matching any exclude
// pattern (fnmatch on the file name). Throws lattice::Error when a pattern matches no file (or
// none is given), naming `setting`: the config key or flag the patterns came from.
std::vector<std::string> expand_file_patterns(const std::vector<std::string>& patterns,
                                              const std::vector<std::string>& excludes,
                                              const std::string& setting);

class ByteSpan final : public TokenSource {
 public:
  ByteSpan(const std::vector<uint8_t>* bytes, int64_t begin, int64_t end)
      : bytes_(bytes), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  int64_t vocab_size() const override { return 256; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  const std::vector<uint8_t>* bytes_;
  int64_t begin_, end_;
};

class ByteCorpus {
 public:
  // Reads every file in order; the last `validation_fraction` of the bytes is the validation split.
  ByteCorpus(const std::vector<std::string>& files, double validation_fraction);

  const TokenSource& train() const { return train_; }
  const TokenSource& validation() const { return validation_; }
  int64_t total_bytes() const { return static_cast<int64_t>(bytes_.size()); }
  int64_t file_count() const { return file_count_; }

 private:
  std::vector<uint8_t> bytes_;
  int64_t file_count_ = 0;
  ByteSpan train_{nullptr, 0, 0}, validation_{nullptr, 0, 0};
};

}  // namespace lattice::data
