// BpeTrainer: a hand-worked example, the target vocabulary size, round trips, determinism, and
// saved files (every format) that load back to the same encodings.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/data/bpe_trainer.hpp"
#include "lattice/data/tokenizer.hpp"
#include "test_tokenizer_util.hpp"

namespace lattice::data {
namespace {

using Ids = std::vector<int32_t>;

// About 60 KB of text: words made of random syllables (so there are many pairs to merge), with
// capitals, numbers, punctuation, some UTF-8 and newlines.
std::string training_text() {
  const char* syllables[] = {"ka", "to",  "ri", "men",   "sol", "ve", "an",  "ti", "por", "lu",
                             "ex", "qua", "de", "ström", "né",  "th", "ing", "er", "o",   "s"};
  const char* separators[] = {" ", " ", " ", " ", ", ", ". ", "! ", "'s ", " 42 ", "\n", "\n\n  "};
  std::string text;
  std::mt19937 rng(17);
  std::uniform_int_distribution<size_t> syllable(0, std::size(syllables) - 1);
  std::uniform_int_distribution<size_t> separator(0, std::size(separators) - 1);
  std::uniform_int_distribution<int> length(1, 4);
  while (text.size() < 60000) {
    for (int k = length(rng); k > 0; --k) text += syllables[syllable(rng)];
    text += separators[separator(rng)];
  }
  return text;
}

TEST(TokenizerTrainer, HandWorkedMerges) {
  BpeTrainerOptions options;
  options.vocab_size = 256 + 2 + 1;
  options.min_frequency = 1;
  BpeTrainer trainer(options);
  trainer.add_text("ab ab ab cd");  // pieces "ab", " ab" x2, " cd": pairs ab 3, " a" 2, ...
  const BpeModel model = trainer.train();
  ASSERT_EQ(model.merges.size(), 2u);
  EXPECT_EQ(model.merges[0], (std::pair<std::string, std::string>{"a", "b"}));
  EXPECT_EQ(model.merges[1], (std::pair<std::string, std::string>{" ", "ab"}));
  ASSERT_EQ(model.special_tokens.size(), 1u);
  EXPECT_EQ(model.special_tokens[0].text, "<|endoftext|>");
  EXPECT_EQ(model.special_tokens[0].id, 258);
  const BpeTokenizer tok(model);
  EXPECT_EQ(tok.encode("ab ab c"), (Ids{256, 257, ' ', 'c'}));
  EXPECT_EQ(tok.vocab_size(), 259);
  EXPECT_EQ(tok.end_of_text(), 258);
}

TEST(TokenizerTrainer, ReachesTargetSizeAndRoundTrips) {
  const std::string text = training_text();
  BpeTrainerOptions options;
  options.vocab_size = 700;
  BpeTrainer trainer(options);
  trainer.add_text(text);
  const BpeModel model = trainer.train();
  const BpeTokenizer tok(model);
  EXPECT_EQ(tok.vocab_size(), 700);
  EXPECT_EQ(model.merges.size(), 700u - 256 - 1);
  const Ids ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size() * 3, text.size());  // over 3 bytes per token on its own training text
  std::mt19937 rng(8);
  for (int i = 0; i < 100; ++i) {
    const std::string bytes = testing::random_bytes(rng, 10 + i * 5);
    ASSERT_EQ(tok.decode(tok.encode(bytes)), bytes);
  }
  EXPECT_EQ(tok.encode("x<|endoftext|>", true).back(), *tok.end_of_text());
  // Deterministic: the same text trains the same merges.
  BpeTrainer again(options);
  again.add_text(text);
  EXPECT_EQ(again.train().merges, model.merges);
}

TEST(TokenizerTrainer, SavedFilesLoadToTheSameEncodings) {
  testing::TempDir dir;
  testing::write_text(dir / "corpus.txt", training_text());
  BpeTrainerOptions options;
  options.vocab_size = 500;
  BpeTrainer trainer(options);
  trainer.add_files({dir / "corpus.txt"});
  const BpeModel model = trainer.train();
  const BpeTokenizer tok(model);
  write_tokenizer_json(model, dir / "tokenizer.json");
  write_tiktoken(model, dir / "trained.tiktoken");
  std::filesystem::create_directories(dir / "hf");
  write_vocab_and_merges(model, dir / "hf" / "vocab.json", dir / "hf" / "merges.txt");
  std::mt19937 rng(21);
  std::vector<std::string> texts = {training_text().substr(0, 5000), "new words: zebra quixotic 😀"};
  for (int i = 0; i < 10; ++i) texts.push_back(testing::random_bytes(rng, 300));
  for (const std::string& spec : {(dir / "tokenizer.json").string(),
                                  (dir / "trained.tiktoken").string(), (dir / "hf").string()}) {
    SCOPED_TRACE(spec);
    const auto loaded = load_tokenizer(spec);
    EXPECT_EQ(loaded->vocab_size(), 500);
    EXPECT_EQ(loaded->end_of_text(), tok.end_of_text());
    for (const auto& text : texts) EXPECT_EQ(loaded->encode(text, true), tok.encode(text, true));
  }
}

TEST(TokenizerTrainer, Errors) {
  BpeTrainerOptions options;
  options.vocab_size = 256;  // no room for <|endoftext|>
  EXPECT_THROW(BpeTrainer{options}, Error);
  options.vocab_size = 1000;
  options.special_tokens = {"<|a|>", "<|a|>"};
  EXPECT_THROW(BpeTrainer{options}, Error);
  options.special_tokens = {};
  BpeTrainer trainer(options);
  EXPECT_THROW(trainer.add_files({"/no/such/corpus.txt"}), Error);
  // A tiny text runs out of pairs: the vocabulary stops short of the target, still valid.
  trainer.add_text("aaaa");
  const BpeTokenizer tok(trainer.train());
  EXPECT_LT(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.decode(tok.encode("aaaa")), "aaaa");
}

}  // namespace
}  // namespace lattice::data

namespace lattice::data {
namespace {

// Runs tests/reference/encode_with_peers.py (tiktoken, Hugging Face tokenizers) on files the
// trainer wrote; both must encode as Lattice does.
TEST(TokenizerTrainer, ReadByTiktokenAndHuggingFace) {
  const std::string script =
      std::string(LATTICE_SOURCE_DIR) + "/tests/reference/encode_with_peers.py";
  if (std::system("/usr/bin/python3 -c 'import tiktoken, tokenizers' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 lacks tiktoken or tokenizers (scripts/install_deps.sh "
                    "installs them from PyPI)";
  testing::TempDir dir;
  BpeTrainerOptions options;
  options.vocab_size = 800;
  BpeTrainer trainer(options);
  trainer.add_text(training_text());
  const BpeModel model = trainer.train();
  const BpeTokenizer tok(model);
  write_tokenizer_json(model, dir / "tokenizer.json");
  write_tiktoken(model, dir / "trained.tiktoken");
  const std::vector<std::string> texts = {
      training_text().substr(0, 3000), "Unseen words: zebra, quixotic; naïve café 😀 日本語",
      "   spaces\t\ttabs\n\n\nnewlines  ", "numbers 1234567 3.14 and 'quotes' they're"};
  testing::write_text(dir / "texts.json", nlohmann::json(texts).dump());
  const std::string command = "/usr/bin/python3 '" + script + "' --dir '" + dir.path().string() +
                              "' --texts '" + (dir / "texts.json").string() + "'";
  std::string output;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
    ASSERT_EQ(pclose(pipe), 0) << output;
  }
  const auto peers = nlohmann::json::parse(output);
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ours = tok.encode(texts[i]);
    EXPECT_EQ(peers["tiktoken"][i].get<std::vector<int32_t>>(), ours) << "tiktoken, text " << i;
    EXPECT_EQ(peers["hf"][i].get<std::vector<int32_t>>(), ours) << "tokenizers, text " << i;
  }
}

}  // namespace
}  // namespace lattice::data
