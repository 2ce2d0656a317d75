// prepare_dataset (`lattice data prepare`): documents split by file or separator, each preceded by
// the end-of-text token, an exact and fixed validation split, llm.c shards of the requested size,
// output independent of the thread count, and a refusal to replace a directory that is not a
// dataset.
#include <gtest/gtest.h>

#include <fstream>

#include "lattice/data/dataset_preparer.hpp"
#include "lattice/data/llmc_shard.hpp"
#include "lattice/data/token_dataset.hpp"
#include "token_file_helpers.hpp"

using namespace lattice::data;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

class Prepare : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_test_directory(); }
  void TearDown() override { fs::remove_all(dir_); }
  void write_text(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::vector<int32_t> split_tokens(const std::string& out, const std::string& split) {
    auto d = open_token_dataset(out, TokenFormat::prepared, 1 << 20);
    const auto& s = split == "train" ? d.train : d.validation;
    std::vector<int32_t> ids(static_cast<size_t>(s->size()));
    s->read(0, s->size(), ids.data());
    return ids;
  }
  static std::string as_text(const std::vector<int32_t>& ids) {
    return std::string(ids.begin(), ids.end());
  }
  fs::path dir_;
};

TEST(ValidationDocuments, ExactCountFixedAndSpread) {
  const auto v = validation_documents(1000, 0.1);
  EXPECT_EQ(std::count(v.begin(), v.end(), true), 100);
  EXPECT_EQ(v, validation_documents(1000, 0.1));
  EXPECT_GT(std::count(v.begin(), v.begin() + 500, true), 20);  // not all at one end
  EXPECT_GT(std::count(v.begin() + 500, v.end(), true), 20);
  const auto few = validation_documents(3, 0.05);
  EXPECT_EQ(std::count(few.begin(), few.end(), true), 1);  // at least one when asked for
  const auto one = validation_documents(1, 0.5);
  EXPECT_EQ(std::count(one.begin(), one.end(), true), 0);  // training keeps a document
  const auto none = validation_documents(50, 0.0);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
}

TEST(ValidationDocuments, SeparatorEscapes) {
  EXPECT_EQ(unescape_separator("\\n%\\n"), "\n%\n");
  EXPECT_EQ(unescape_separator("a\\tb\\\\"), "a\tb\\");
  expect_error([] { unescape_separator("\\q"); }, {"\\q", "\\n"});
}

TEST_F(Prepare, ByteDocumentsSplitOnSeparatorIntoExactSplits) {
  std::string text_a, text_b;
  std::vector<std::string> docs;
  for (int i = 0; i < 30; ++i) {
    docs.push_back("fortune number " + std::to_string(i) + " says hello");
    std::string& t = i < 20 ? text_a : text_b;
    t += docs.back() + "\n%\n";
  }
  write_text("a.txt", text_a);
  write_text("b.txt", "\n%\n" + text_b);  // a leading separator: no empty document
  PrepareOptions o;
  o.inputs = {(dir_ / "*.txt").string()};
  o.tokenizer = "byte";
  o.out = (dir_ / "out").string();
  o.separator = "\n%\n";
  o.val_fraction = 0.2;
  o.threads = 3;
  const auto m = prepare_dataset(o);
  EXPECT_EQ(m.train_documents, 24);
  EXPECT_EQ(m.val_documents, 6);
  EXPECT_EQ(m.vocab_size, 256);
  EXPECT_FALSE(m.end_of_text.has_value());
  EXPECT_EQ(m.token_type, "uint16");
  EXPECT_EQ(m.tokenizer, "byte");
  const auto val = validation_documents(30, 0.2);
  std::string expect_train, expect_val;
  for (int i = 0; i < 30; ++i)
    (val[static_cast<size_t>(i)] ? expect_val : expect_train) += docs[static_cast<size_t>(i)];
  EXPECT_EQ(as_text(split_tokens(o.out, "train")), expect_train);
  EXPECT_EQ(as_text(split_tokens(o.out, "val")), expect_val);
  EXPECT_EQ(read_manifest(o.out).train_tokens, static_cast<int64_t>(expect_train.size()));
}

TEST_F(Prepare, ShardsHaveTheRequestedSizeAndOutputIgnoresThreadCount) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "document " + std::to_string(i * 7919) + "\n\n";
  write_text("corpus.txt", text);
  PrepareOptions o;
  o.inputs = {(dir_ / "corpus.txt").string()};
  o.separator = "\n\n";
  o.shard_tokens = 500;
  o.val_fraction = 0.1;
  o.threads = 1;
  o.out = (dir_ / "one").string();
  const auto m = prepare_dataset(o);
  o.threads = 4;
  o.out = (dir_ / "four").string();
  prepare_dataset(o);
  const auto train_files = m.files("train");
  ASSERT_EQ(static_cast<int64_t>(train_files.size()), (m.train_tokens + 499) / 500);
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const auto& s = m.shards[i];
    const bool last_of_split = i + 1 == m.shards.size() || m.shards[i + 1].split != s.split;
    if (!last_of_split) {
      EXPECT_EQ(s.tokens, 500) << s.file;
    }
    EXPECT_EQ(read_bytes(dir_ / "one" / s.file), read_bytes(dir_ / "four" / s.file)) << s.file;
    EXPECT_EQ(LlmcShard((dir_ / "one" / s.file).string(), 256).size(), s.tokens);
  }
  EXPECT_EQ(read_bytes(dir_ / "one" / "manifest.json"),
            read_bytes(dir_ / "four" / "manifest.json"));
}

TEST_F(Prepare, Gpt2DocumentsStartWithEndOfText) {
  const fs::path gpt2 = fs::path(LATTICE_TESTDATA_DIR) / "gpt2" / "encoder.json";
  if (!fs::exists(gpt2)) GTEST_SKIP() << "no GPT-2 files at " << gpt2;
  write_text("1.txt", "Hello world");
  write_text("2.txt", "Hello world");
  PrepareOptions o;
  o.inputs = {(dir_ / "1.txt").string(), (dir_ / "2.txt").string()};
  o.tokenizer = gpt2.string();
  o.out = (dir_ / "out").string();
  o.val_fraction = 0;
  const auto m = prepare_dataset(o);
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_EQ(m.end_of_text, std::optional<int32_t>(50256));
  EXPECT_EQ(m.tokenizer, fs::absolute(gpt2).lexically_normal().string());
  // "Hello world" is [15496, 995] in GPT-2 (tiktoken's published encoding).
  EXPECT_EQ(split_tokens(o.out, "train"),
            (std::vector<int32_t>{50256, 15496, 995, 50256, 15496, 995}));
  EXPECT_EQ(m.val_tokens, 0);
}

TEST_F(Prepare, RefusesToReplaceADirectoryThatIsNotADataset) {
  write_text("a.txt", "some text");
  fs::create_directories(dir_ / "precious");
  write_text("precious/thesis.tex", "do not delete");
  PrepareOptions o;
  o.inputs = {(dir_ / "a.txt").string()};
  o.out = (dir_ / "precious").string();
  expect_error([&] { prepare_dataset(o); }, {"precious", "not a dataset"});
  EXPECT_TRUE(fs::exists(dir_ / "precious" / "thesis.tex"));
  o.out = (dir_ / "fresh").string();
  o.inputs = {(dir_ / "missing*.txt").string()};
  expect_error([&] { prepare_dataset(o); }, {"missing*.txt"});
  EXPECT_FALSE(fs::exists(dir_ / "fresh"));
  // A second run over an existing dataset replaces it.
  o.inputs = {(dir_ / "a.txt").string()};
  prepare_dataset(o);
  write_text("a.txt", "other text, longer");
  EXPECT_EQ(prepare_dataset(o).train_tokens, 18);
}

}  // namespace
