// Helpers shared by the tokenizer tests: where the GPT-2 files are, loading them once, temporary
// directories, random byte strings.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "lattice/data/bpe_tokenizer.hpp"
#include "lattice/data/tokenizer_files.hpp"

namespace lattice::data::testing {

inline std::filesystem::path gpt2_dir() {
  return std::filesystem::path(LATTICE_TESTDATA_DIR) / "gpt2";
}

inline bool have_gpt2_files() {
  return std::filesystem::exists(gpt2_dir() / "encoder.json") &&
         std::filesystem::exists(gpt2_dir() / "vocab.bpe");
}

#define LATTICE_SKIP_WITHOUT_GPT2()                                         \
  if (!::lattice::data::testing::have_gpt2_files())                         \
  GTEST_SKIP()                                                              \
      << "GPT-2 tokenizer files (encoder.json, vocab.bpe) are absent from " \
      << ::lattice::data::testing::gpt2_dir()                               \
      << ": see tests/testdata/gpt2/README.md (LATTICE_TESTDATA_DIR in tests/CMakeLists.txt)"

// The GPT-2 tokenizer, loaded once per test program.
inline const BpeTokenizer& gpt2() {
  static const std::unique_ptr<BpeTokenizer> tokenizer = make_bpe_tokenizer(
      read_vocab_and_merges(gpt2_dir() / "encoder.json", gpt2_dir() / "vocab.bpe"), "gpt2");
  return *tokenizer;
}

// A fresh empty directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device device;
    path_ = std::filesystem::temp_directory_path() /
            ("lattice_tok_test_" + std::to_string(device()) + std::to_string(device()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Random bytes biased towards text-like content: ASCII letters, spaces, digits, multi-byte UTF-8
// lead and continuation bytes, and fully random bytes (so invalid UTF-8 is frequent).
inline std::string random_bytes(std::mt19937& rng, size_t length) {
  static const std::string kPieces[] = {"a",        "b",    "e",    "th", " ", "  ",   "\n",
                                        "1",        "23",   "'s",   "'",  "é", "日本", "😀",
                                        "\xF0\x9F", "\x80", "\xC3", "!",  "\t"};
  std::string out;
  std::uniform_int_distribution<int> kind(0, 3);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<size_t> piece(0, std::size(kPieces) - 1);
  while (out.size() < length) {
    if (kind(rng) == 0)
      out += static_cast<char>(byte(rng));
    else
      out += kPieces[piece(rng)];
  }
  out.resize(length);
  return out;
}

}  // namespace lattice::data::testing
