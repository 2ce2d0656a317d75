// The loader: IndexPermutation is a bijection, ShuffledWindowLoader visits every window exactly
// once per epoch in an order fixed by (seed, epoch) alone, and open_token_dataset reads prepared
// directories, llm.c shard globs (validation by name) and Megatron prefixes as one stream per
// split, refusing datasets that do not fit the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "lattice/data/megatron_dataset.hpp"
#include "lattice/data/shuffled_window_loader.hpp"
#include "lattice/data/token_dataset.hpp"
#include "token_file_helpers.hpp"

using namespace lattice::data;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// An in-memory stream for loader tests: token i is i.
class IotaSource final : public TokenSource {
 public:
  explicit IotaSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t vocab_size() const override { return n_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    ASSERT_TRUE(offset >= 0 && offset + count <= n_);
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(offset + i);
  }

 private:
  int64_t n_;
};

TEST(IndexPermutation, IsABijectionForEverySize) {
  for (uint64_t size : {1u, 2u, 3u, 5u, 16u, 17u, 100u, 1000u, 4097u}) {
    for (uint64_t key : {0u, 1u, 99u}) {
      IndexPermutation perm(size, key);
      std::vector<int> seen(size, 0);
      for (uint64_t i = 0; i < size; ++i) {
        const uint64_t j = perm(i);
        ASSERT_LT(j, size);
        ++seen[j];
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
          << "size " << size << " key " << key;
    }
  }
}

TEST(IndexPermutation, KeysGiveDifferentOrders) {
  IndexPermutation a(1000, 1), b(1000, 2);
  int same = 0, fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
  }
  EXPECT_LT(same, 20);  // independent permutations agree on ~1 place in expectation
  EXPECT_LT(fixed, 20);
}

TEST(ShuffledWindowLoader, EachEpochVisitsEveryWindowOnce) {
  const int64_t seq_len = 8;
  IotaSource source(8 * 50 + 1);  // exactly 50 windows
  ShuffledWindowLoader loader(source, seq_len, 1234, true, "test");
  ASSERT_EQ(loader.windows_per_epoch(), 50);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t n = 0; n < 50; ++n) epoch0.push_back(loader.window_start(n));
  for (int64_t n = 50; n < 100; ++n) epoch1.push_back(loader.window_start(n));
  for (auto* epoch : {&epoch0, &epoch1}) {
    auto sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t w = 0; w < 50; ++w) EXPECT_EQ(sorted[static_cast<size_t>(w)], w * seq_len);
  }
  EXPECT_NE(epoch0, epoch1);  // reshuffled every epoch
  std::vector<int64_t> in_order(50);
  for (int64_t w = 0; w < 50; ++w) in_order[static_cast<size_t>(w)] = w * seq_len;
  EXPECT_NE(epoch0, in_order);
}

TEST(ShuffledWindowLoader, SamplesAreTheStreamAtTheWindowShiftedByOne) {
  IotaSource source(1000);
  ShuffledWindowLoader loader(source, 16, 7, true, "test");
  std::vector<int32_t> in(16), tgt(16);
  for (int64_t n : {0, 5, 61, 62, 200}) {
    loader.sample(n, in.data(), tgt.data());
    const int64_t start = loader.window_start(n);
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[t], start + t);
      EXPECT_EQ(tgt[t], start + t + 1);
    }
  }
}

TEST(ShuffledWindowLoader, OrderDependsOnSeedAlone) {
  IotaSource source(5000);
  ShuffledWindowLoader a(source, 10, 42, true, "test"), b(source, 10, 42, true, "test"),
      c(source, 10, 43, true, "test");
  int differ = 0;
  for (int64_t n = 0; n < 1000; ++n) {
    EXPECT_EQ(a.window_start(n), b.window_start(n));
    differ += a.window_start(n) != c.window_start(n);
  }
  EXPECT_GT(differ, 900);
}

TEST(ShuffledWindowLoader, WithoutShuffleReadsWindowsInOrderAndWraps) {
  IotaSource source(41);
  ShuffledWindowLoader loader(source, 10, 1, false, "test");
  EXPECT_EQ(loader.windows_per_epoch(), 4);
  EXPECT_EQ(loader.window_start(0), 0);
  EXPECT_EQ(loader.window_start(3), 30);
  EXPECT_EQ(loader.window_start(4), 0);
}

TEST(ShuffledWindowLoader, RefusesAStreamShorterThanOneWindow) {
  IotaSource source(10);
  expect_error([&] { ShuffledWindowLoader(source, 10, 1, true, "the validation split"); },
               {"the validation split", "10 tokens", "seq_len + 1 = 11"});
}

class TokenDatasets : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_test_directory(); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::vector<int32_t> read_all(const TokenSource& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.read(0, s.size(), out.data());
  return out;
}

TEST_F(TokenDatasets, PreparedDirectoryReadsShardsAsOneStream) {
  write_prepared_dataset(dir_ / "ds", {iota_tokens(100), iota_tokens(50, 100)}, iota_tokens(30, 7),
                         1000);
  for (auto format : {TokenFormat::automatic, TokenFormat::prepared}) {
    auto d = open_token_dataset((dir_ / "ds").string(), format, 1000);
    ASSERT_TRUE(d.manifest.has_value());
    EXPECT_EQ(d.manifest->vocab_size, 1000);
    EXPECT_EQ(read_all(*d.train), iota_tokens(150));
    ASSERT_NE(d.validation, nullptr);
    EXPECT_EQ(read_all(*d.validation), iota_tokens(30, 7));
    std::vector<int32_t> across(10);  // a read that crosses the shard boundary
    d.train->read(95, 10, across.data());
    EXPECT_EQ(across, iota_tokens(10, 95));
  }
}

TEST_F(TokenDatasets, PreparedDirectoryThatDoesNotFitTheModelIsRefused) {
  write_prepared_dataset(dir_ / "ds", {iota_tokens(100)}, {}, 5000);
  expect_error([&] { open_token_dataset((dir_ / "ds").string(), TokenFormat::automatic, 4096); },
               {"vocabulary of 5000", "model.vocab_size >= 5000"});
  // A shard replaced by a shorter one: the manifest's count no longer matches.
  write_llmc_shard((dir_ / "ds" / "train_0.bin").string(), iota_tokens(90), TokenType::uint16);
  expect_error([&] { open_token_dataset((dir_ / "ds").string(), TokenFormat::automatic, 8192); },
               {"90 tokens", "manifest.json says 100"});
}

TEST_F(TokenDatasets, LlmcGlobsSplitValidationByName) {
  write_llmc_shard((dir_ / "fw_train_000001.bin").string(), iota_tokens(20), TokenType::uint16);
  write_llmc_shard((dir_ / "fw_train_000002.bin").string(), iota_tokens(20, 20), TokenType::uint16);
  write_llmc_shard((dir_ / "fw_val_000000.bin").string(), iota_tokens(15, 3), TokenType::uint16);
  auto d = open_token_dataset((dir_ / "fw_*.bin").string(), TokenFormat::automatic, 100);
  EXPECT_FALSE(d.manifest.has_value());
  EXPECT_EQ(read_all(*d.train), iota_tokens(40));
  ASSERT_NE(d.validation, nullptr);
  EXPECT_EQ(read_all(*d.validation), iota_tokens(15, 3));
  // A token outside the model's vocabulary names the shard.
  expect_error([&] { open_token_dataset((dir_ / "fw_*.bin").string(), TokenFormat::llmc, 30); },
               {"fw_train_000002.bin", "outside the vocabulary [0, 30)"});
  expect_error([&] { open_token_dataset((dir_ / "none_*.bin").string(), TokenFormat::llmc, 30); },
               {"none_*.bin", "matches no readable file"});
}

TEST_F(TokenDatasets, MegatronPrefixOpensWithOrWithoutExtension) {
  std::vector<std::vector<int32_t>> docs = {iota_tokens(5), iota_tokens(7, 5)};
  write_megatron_dataset((dir_ / "mg").string(), docs, TokenType::int32);
  for (const char* spec : {"mg", "mg.idx", "mg.bin"}) {
    auto d = open_token_dataset((dir_ / spec).string(), TokenFormat::automatic, 100);
    EXPECT_EQ(read_all(*d.train), iota_tokens(12)) << spec;
    EXPECT_EQ(d.validation, nullptr);
  }
  auto with_val = open_token_dataset((dir_ / "mg").string(), TokenFormat::megatron, 100,
                                     (dir_ / "mg").string());
  ASSERT_NE(with_val.validation, nullptr);
  EXPECT_EQ(with_val.validation->size(), 12);
}

TEST_F(TokenDatasets, FormatNamesAreChecked) {
  EXPECT_EQ(parse_token_format("auto"), TokenFormat::automatic);
  EXPECT_EQ(parse_token_format("megatron"), TokenFormat::megatron);
  expect_error([] { parse_token_format("parquet"); }, {"data.format 'parquet'", "\"llmc\""});
  expect_error([&] { open_token_dataset((dir_ / "x").string(), TokenFormat::prepared, 10); },
               {"not a directory", "lattice data prepare"});
}

}  // namespace
