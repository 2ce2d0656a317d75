// BatchSource over token files: data-parallel ranks read disjoint windows and together exactly
// what one rank with an n-times larger micro-batch reads, every rank gets the same number of
// batches, a restored position gives the same next batch, and the [data] keys resolve the
// tokenizer from a prepared dataset (absolute) or refuse a mismatch. The byte path still works.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "../data/token_file_helpers.hpp"
#include "lattice/train/batch_source.hpp"
#include "lattice/train/train_config.hpp"

using namespace lattice::testing;
using lattice::train::BatchSource;
using lattice::train::load_train_config;
using lattice::train::TrainConfig;
namespace fs = std::filesystem;

namespace {

class BatchSourceTokens : public ::testing::Test {
 protected:
  static constexpr int64_t kSeqLen = 8;
  static constexpr int64_t kWindows = 96;  // divisible by batch × ranks below
  void SetUp() override {
    dir_ = fresh_test_directory();
    // Token i is i: a window is recognised by its first token.
    write_prepared_dataset(dir_ / "ds",
                           {iota_tokens(kWindows * kSeqLen / 2),
                            iota_tokens(kWindows * kSeqLen / 2 + 1, kWindows * kSeqLen / 2)},
                           iota_tokens(5 * kSeqLen + 1, 9), 2000);
  }
  void TearDown() override { fs::remove_all(dir_); }
  TrainConfig config(std::vector<std::string> extra = {}) const {
    std::vector<std::string> o = {"--data.dataset=" + (dir_ / "ds").string(),
                                  "--model.vocab_size=2048", "--training.seq_len=8",
                                  "--model.max_seq_len=8", "--training.micro_batch_size=4"};
    o.insert(o.end(), extra.begin(), extra.end());
    return load_train_config("", o);
  }
  // First tokens of `batch` samples read by next().
  static std::vector<int32_t> next_starts(BatchSource& s, int64_t batch) {
    std::vector<int32_t> in(static_cast<size_t>(batch * kSeqLen)), tgt(in.size());
    s.next(in.data(), tgt.data(), batch);
    std::vector<int32_t> starts;
    for (int64_t b = 0; b < batch; ++b) {
      starts.push_back(in[static_cast<size_t>(b * kSeqLen)]);
      for (int64_t t = 0; t < kSeqLen; ++t) {  // a window of the stream, targets shifted by one
        EXPECT_EQ(in[static_cast<size_t>(b * kSeqLen + t)], starts.back() + t);
        EXPECT_EQ(tgt[static_cast<size_t>(b * kSeqLen + t)], starts.back() + t + 1);
      }
    }
    return starts;
  }
  fs::path dir_;
};

TEST_F(BatchSourceTokens, RanksReadDisjointWindowsThatTogetherEqualOneLargeBatch) {
  const auto cfg = config();
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE(ranks);
    const int64_t batch = 4, steps = kWindows / (batch * ranks);  // exactly one epoch
    BatchSource single(cfg, 0, 1);
    std::vector<std::unique_ptr<BatchSource>> rank;
    for (int r = 0; r < ranks; ++r) rank.push_back(std::make_unique<BatchSource>(cfg, r, ranks));
    std::multiset<int32_t> epoch;
    for (int64_t step = 0; step < steps; ++step) {
      const auto big = next_starts(single, batch * ranks);
      std::vector<int32_t> joined;
      for (int r = 0; r < ranks; ++r) {
        const auto part = next_starts(*rank[static_cast<size_t>(r)], batch);
        ASSERT_EQ(part.size(), static_cast<size_t>(batch));  // equal batch counts on every rank
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, big);
      epoch.insert(joined.begin(), joined.end());
    }
    // One epoch over all ranks: every window exactly once.
    EXPECT_EQ(epoch.size(), static_cast<size_t>(kWindows));
    for (int64_t w = 0; w < kWindows; ++w)
      EXPECT_EQ(epoch.count(static_cast<int32_t>(w * kSeqLen)), 1u) << "window " << w;
    for (const auto& r : rank) EXPECT_EQ(r->position(), single.position());
  }
}

TEST_F(BatchSourceTokens, RestoredPositionGivesTheSameNextBatch) {
  const auto cfg = config();
  BatchSource first(cfg, 1, 2);
  for (int i = 0; i < 7; ++i) next_starts(first, 4);
  const int64_t saved = first.position();
  EXPECT_EQ(saved, 7 * 4 * 2);
  const auto expected = next_starts(first, 4);
  BatchSource resumed(cfg, 1, 2);
  resumed.set_position(saved);
  EXPECT_EQ(next_starts(resumed, 4), expected);
  // A different seed reads a different order.
  BatchSource other(config({"--training.seed=99"}), 1, 2);
  other.set_position(saved);
  EXPECT_NE(next_starts(other, 4), expected);
}

TEST_F(BatchSourceTokens, ValidationReadsTheValidationShardInOrder) {
  BatchSource s(config(), 0, 1);
  ASSERT_TRUE(s.has_validation());
  EXPECT_EQ(s.vocab_size(), 2000);
  std::vector<int32_t> in(2 * kSeqLen), tgt(in.size());
  s.validation_batch(1, in.data(), tgt.data(), 2);
  EXPECT_EQ(in[0], 9 + 2 * kSeqLen);  // windows 2 and 3 of the validation stream
  EXPECT_EQ(in[kSeqLen], 9 + 3 * kSeqLen);
  EXPECT_EQ(tgt[kSeqLen - 1], 9 + 3 * kSeqLen);
}

TEST_F(BatchSourceTokens, DataKeysResolveTheTokenizer) {
  // The dataset's tokenizer is adopted (absolute, as written in its manifest).
  EXPECT_EQ(config().data.tokenizer, "/test/tokenizer.json");
  EXPECT_EQ(config({"--data.tokenizer=/test/tokenizer.json"}).data.tokenizer,
            "/test/tokenizer.json");
  expect_error([&] { config({"--data.tokenizer=/other/tokenizer.json"}); },
               {"/other/tokenizer.json", "/test/tokenizer.json", "data.tokenizer"});
  expect_error([&] { config({"--data.format=csv"}); }, {"data.format 'csv'"});
  expect_error([&] { BatchSource(config({"--model.vocab_size=1024"}), 0, 1); },
               {"vocabulary of 2000", "model.vocab_size >= 2000"});
  // A relative tokenizer path becomes absolute (so `lattice generate` finds it from anywhere).
  const auto text = load_train_config(
      "", {"--data.tokenizer=tok/tokenizer.json", "--data.dataset=" + (dir_ / "x*.bin").string()});
  EXPECT_EQ(text.data.tokenizer, (fs::current_path() / "tok/tokenizer.json").string());
  expect_error([] { load_train_config("", {"--data.tokenizer=tok.json"}); },
               {"data.tokenizer", "lattice data prepare", "data.dataset"});
}

TEST(BatchSourceBytes, TextFilesStillReadAsBytes) {
  const auto dir = fresh_test_directory();
  std::ofstream(dir / "a.txt") << std::string(400, 'a') + std::string(100, 'b');
  auto cfg = load_train_config(
      "", {"--data.train_files=" + (dir / "a.txt").string(), "--data.val_fraction=0.2",
           "--training.seq_len=8", "--model.max_seq_len=8"});
  BatchSource s(cfg, 0, 1);
  EXPECT_EQ(s.vocab_size(), 256);
  std::vector<int32_t> in(8), tgt(8);
  s.next(in.data(), tgt.data(), 1);
  EXPECT_EQ(in[0], 'a');
  ASSERT_TRUE(s.has_validation());
  s.validation_batch(0, in.data(), tgt.data(), 1);
  EXPECT_EQ(in[0], 'b');
  EXPECT_EQ(s.position(), 1);
  fs::remove_all(dir);
}

}  // namespace
