// Test helpers for the token-file tests: a fresh temporary directory per test, raw file writes
// (to build corrupt files byte by byte) and an expectation that a call throws lattice::Error whose
// message contains given fragments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/dataset_manifest.hpp"
#include "lattice/data/llmc_shard.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::testing {

inline std::filesystem::path fresh_test_directory() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("lattice-data-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
              std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected lattice::Error";
  } catch (const lattice::Error& e) {
    const std::string message = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' missing from: " << message;
  }
}

// Writes a dataset directory as `lattice data prepare` lays it out: one llm.c shard per entry of
// `train_shards` (and `val` when not empty) and a manifest naming them (tokenizer "byte"-free
// spec "/test/tokenizer.json").
inline void write_prepared_dataset(const std::filesystem::path& dir,
                                   const std::vector<std::vector<int32_t>>& train_shards,
                                   const std::vector<int32_t>& val, int64_t vocab_size) {
  std::filesystem::create_directories(dir);
  lattice::data::DatasetManifest m;
  m.tokenizer = "/test/tokenizer.json";
  m.tokenizer_name = "test";
  m.vocab_size = vocab_size;
  const auto type = lattice::data::llmc_token_type_for_vocab(vocab_size);
  m.token_type = lattice::data::token_type_name(type);
  for (size_t i = 0; i < train_shards.size(); ++i) {
    const std::string name = "train_" + std::to_string(i) + ".bin";
    lattice::data::write_llmc_shard((dir / name).string(), train_shards[i], type);
    m.shards.push_back({name, "train", static_cast<int64_t>(train_shards[i].size())});
    m.train_tokens += static_cast<int64_t>(train_shards[i].size());
  }
  if (!val.empty()) {
    lattice::data::write_llmc_shard((dir / "val_0.bin").string(), val, type);
    m.shards.push_back({"val_0.bin", "val", static_cast<int64_t>(val.size())});
    m.val_tokens = static_cast<int64_t>(val.size());
  }
  lattice::write_text_atomic((dir / lattice::data::kManifestName).string(), m.to_json());
}

// Tokens 0, 1, ..., n-1 shifted by `first` (every window is recognisable by its first token).
inline std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return t;
}

}  // namespace lattice::testing
