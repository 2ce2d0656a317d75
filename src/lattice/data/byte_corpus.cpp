// ByteCorpus: see byte_corpus.hpp.
#include "lattice/data/byte_corpus.hpp"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "lattice/core/error.hpp"

namespace lattice::data {

std::vector<std::string> expand_file_patterns(const std::vector<std::string>& patterns,
                                              const std::vector<std::string>& excludes,
                                              const std::string& setting) {
  check(!patterns.empty(), setting + " is empty: list the corpus files (globs allowed)");
  std::vector<std::string> files;
  for (const auto& pattern : patterns) {
    glob_t matches{};
    int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    size_t before = files.size();
    if (rc == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        std::string path = matches.gl_pathv[i];
        std::string name = std::filesystem::path(path).filename().string();
        bool excluded = std::any_of(excludes.begin(), excludes.end(), [&](const std::string& e) {
          return ::fnmatch(e.c_str(), name.c_str(), 0) == 0;
        });
        if (!excluded && std::filesystem::is_regular_file(path)) files.push_back(path);
      }
    }
    globfree(&matches);
    check(files.size() > before, "corpus file pattern '" + pattern +
                                     "' matches no readable file: check " + setting +
                                     " (the demo's corpus comes from Debian's 'fortunes' "
                                     "package)");
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

void ByteSpan::read(int64_t offset, int64_t count, int32_t* out) const {
  check(offset >= 0 && count >= 0 && offset + count <= size(),
        "read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
            ") outside a corpus split of " + std::to_string(size()) + " tokens");
  const uint8_t* src = bytes_->data() + begin_ + offset;
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
}

ByteCorpus::ByteCorpus(const std::vector<std::string>& files, double validation_fraction) {
  check(validation_fraction >= 0.0 && validation_fraction < 1.0,
        "data.val_fraction must be in [0, 1), got " + std::to_string(validation_fraction));
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    check(in.good(), "cannot read corpus file " + path + ": check that it exists and is readable");
    bytes_.insert(bytes_.end(), std::istreambuf_iterator<char>(in),
                  std::istreambuf_iterator<char>());
    ++file_count_;
  }
  const auto total = static_cast<int64_t>(bytes_.size());
  check(total > 0, "the corpus is empty: data.train_files matched only empty files");
  const auto validation = static_cast<int64_t>(static_cast<double>(total) * validation_fraction);
  train_ = ByteSpan(&bytes_, 0, total - validation);
  validation_ = ByteSpan(&bytes_, total - validation, total);
}

}  // namespace lattice::data
