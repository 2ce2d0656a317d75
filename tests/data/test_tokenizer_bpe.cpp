// BPE merging and pre-tokenization against independent references: a naive BPE written here
// (merge the adjacent pair of lowest rank, leftmost first, on strings), GPT-2's pattern on
// hand-worked examples, GPT-2's byte alphabet from its definition, and invalid UTF-8.
#include <gtest/gtest.h>

#include <map>

#include "lattice/core/error.hpp"
#include "lattice/data/bpe_trainer.hpp"
#include "lattice/data/byte_level.hpp"
#include "lattice/data/pretokenizer.hpp"
#include "test_tokenizer_util.hpp"

namespace lattice::data {
namespace {

using Ids = std::vector<int32_t>;

// Textbook BPE on strings: the answer BpeTokenizer must give for one piece.
class NaiveBpe {
 public:
  explicit NaiveBpe(const BpeModel& model) {
    for (size_t r = 0; r < model.merges.size(); ++r) rank_.emplace(model.merges[r], r);
    for (const auto& token : model.tokens) id_[token.bytes] = token.id;
  }
  Ids encode(const std::string& piece) const {
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    while (parts.size() > 1) {
      size_t best = 0, best_rank = SIZE_MAX;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = rank_.find({parts[i], parts[i + 1]});
        if (it != rank_.end() && it->second < best_rank) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank == SIZE_MAX) break;
      parts[best] += parts[best + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    Ids ids;
    for (const auto& part : parts) ids.push_back(id_.at(part));
    return ids;
  }

 private:
  std::map<std::pair<std::string, std::string>, size_t> rank_;
  std::map<std::string, int32_t> id_;
};

std::vector<std::string> test_pieces(std::mt19937& rng) {
  std::vector<std::string> pieces = {"hello",
                                     " world",
                                     "'s",
                                     "  ",
                                     " 123456789",
                                     "\n\n",
                                     "pneumonoultramicroscopicsilicovolcanoconiosis",
                                     std::string(700, 'a'),
                                     std::string(300, ' ')};
  std::uniform_int_distribution<int> letter('a', 'z');
  for (int i = 0; i < 20; ++i) {  // random words, some longer than 256 bytes
    std::string word = " ";
    const int length = i < 15 ? 3 + i : 260 + i * 20;
    for (int k = 0; k < length; ++k) word += static_cast<char>(letter(rng));
    pieces.push_back(word);
  }
  Pretokenizer pretokenizer;
  for (int i = 0; i < 30; ++i) {
    const std::string text = testing::random_bytes(rng, 300);
    for (auto piece : pretokenizer.pieces(text)) pieces.emplace_back(piece);
  }
  return pieces;
}

TEST(TokenizerBpe, Gpt2PiecesMatchNaiveBpe) {
  LATTICE_SKIP_WITHOUT_GPT2();
  std::mt19937 rng(5);
  const BpeTokenizer& tok = testing::gpt2();
  const NaiveBpe naive(tok.model());
  for (const auto& piece : test_pieces(rng)) {
    Ids ids;
    tok.encode_piece(piece, ids);
    ASSERT_EQ(ids, naive.encode(piece)) << "piece '" << piece << "'";
  }
}

TEST(TokenizerBpe, TrainedModelPiecesMatchNaiveBpe) {
  std::mt19937 rng(11);
  BpeTrainerOptions options;
  options.vocab_size = 600;
  BpeTrainer trainer(options);
  std::string text;
  std::uniform_int_distribution<int> letter('a', 'h');
  for (int i = 0; i < 4000; ++i) {
    text += ' ';
    for (int k = 0; k < 2 + i % 7; ++k) text += static_cast<char>(letter(rng));
  }
  trainer.add_text(text);
  const BpeTokenizer tok(trainer.train());
  const NaiveBpe naive(tok.model());
  for (const auto& piece : test_pieces(rng)) {
    Ids ids;
    tok.encode_piece(piece, ids);
    ASSERT_EQ(ids, naive.encode(piece)) << "piece '" << piece << "'";
  }
}

TEST(TokenizerBpe, TiktokenRanksMergeByLowestRankOfConcatenation) {
  // Ranks only (no merges): adjacent parts merge into the token of lowest rank they form.
  BpeModel model;
  for (int b = 0; b < 256; ++b) model.tokens.push_back({std::string(1, static_cast<char>(b)), b});
  model.tokens.push_back({"bc", 256});
  model.tokens.push_back({"ab", 257});
  model.tokens.push_back({"abc", 258});  // reachable from a+bc (bc merges first)
  const BpeTokenizer tok(model);
  EXPECT_EQ(tok.encode("abc"), (Ids{258}));  // whole-piece lookup, as tiktoken
  Ids ids;
  tok.encode_piece("abcab", ids);  // bc (256) first: a|bc|a|b -> abc (258) vs ab (257): ab first
  EXPECT_EQ(ids, (Ids{258, 257}));
}

TEST(TokenizerBpe, PretokenizerSplitsLikeGpt2) {
  Pretokenizer pre;
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(pre.pieces("Hello world's  123\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " 123", "\n\n", " x"}));
  EXPECT_EQ(pre.pieces("I'll we've they're"), (Pieces{"I", "'ll", " we", "'ve", " they", "'re"}));
  EXPECT_EQ(pre.pieces("café ß 日本語!!  ?"), (Pieces{"café", " ß", " 日本語", "!!", " ", " ?"}));
  EXPECT_EQ(pre.pieces("a\t\tb   "), (Pieces{"a", "\t", "\t", "b", "   "}));
  EXPECT_EQ(pre.pieces("x\u00a0y"), (Pieces{"x", "\u00a0", "y"}));  // NBSP is \s in Unicode mode
}

TEST(TokenizerBpe, PretokenizerKeepsInvalidUtf8) {
  Pretokenizer pre;
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(pre.pieces("ab\xFF"
                       "cd"),
            (Pieces{"ab", "\xFF", "cd"}));
  EXPECT_EQ(pre.pieces("a\xC3"), (Pieces{"a", "\xC3"}));
  EXPECT_EQ(pre.pieces("\x80\x80 x"), (Pieces{"\x80\x80", " x"}));
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const std::string text = testing::random_bytes(rng, 1 + i * 3);
    std::string joined;
    for (auto piece : pre.pieces(text)) {
      ASSERT_FALSE(piece.empty());
      joined += piece;
    }
    ASSERT_EQ(joined, text);
  }
  EXPECT_THROW(Pretokenizer("(unclosed"), Error);
}

TEST(TokenizerBpe, ByteLevelAlphabetIsGpt2s) {
  // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest for U+0100.. in order.
  EXPECT_EQ(byte_to_unicode('!'), U'!');
  EXPECT_EQ(byte_to_unicode(0), U'\u0100');
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');  // "Ċ"
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');   // "Ġ"
  EXPECT_EQ(byte_to_unicode(0x7F), U'\u0121');
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');
  EXPECT_EQ(byte_to_unicode(0xFF), U'\u00FF');
  EXPECT_EQ(bytes_to_unicode_string(" hi\n"), "\u0120hi\u010A");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(unicode_string_to_bytes(bytes_to_unicode_string(all)), all);
  EXPECT_EQ(unicode_string_to_bytes("€"), std::nullopt);     // outside the table
  EXPECT_EQ(unicode_string_to_bytes("\xC3"), std::nullopt);  // truncated UTF-8
  EXPECT_EQ(unicode_string_to_bytes(" "), std::nullopt);     // a space is spelled "Ġ"
}

}  // namespace
}  // namespace lattice::data
