// GPT-2's BPE with the published files: the encodings tiktoken's tests publish, the reference
// encodings tiktoken produced (tests/reference/make_tokenizer_reference.py), decoding, round trips
// of arbitrary bytes, and the same files converted to every other format.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer.hpp"
#include "test_tokenizer_util.hpp"

namespace lattice::data {
namespace {

using testing::gpt2;
using Ids = std::vector<int32_t>;

TEST(TokenizerGpt2, PublishedEncodings) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const BpeTokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.end_of_text(), 50256);
  EXPECT_EQ(tok.encode("hello world"), (Ids{31373, 995}));
  EXPECT_EQ(tok.encode("hello <|endoftext|>", true), (Ids{31373, 220, 50256}));
  EXPECT_EQ(tok.encode("0"), (Ids{15}));
  EXPECT_EQ(tok.encode("00"), (Ids{405}));
  EXPECT_EQ(tok.encode("000"), (Ids{830}));
  EXPECT_EQ(tok.encode("0000"), (Ids{2388}));
  EXPECT_EQ(tok.encode("000000000"), (Ids{10535, 830}));
}

TEST(TokenizerGpt2, SpecialTokensOnlyWhenAllowed) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const BpeTokenizer& tok = gpt2();
  const Ids plain = tok.encode("hello <|endoftext|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tok.decode(plain), "hello <|endoftext|>");
  EXPECT_EQ(tok.encode("<|endoftext|><|endoftext|>", true), (Ids{50256, 50256}));
  EXPECT_EQ(tok.decode(Ids{50256}), "<|endoftext|>");
}

TEST(TokenizerGpt2, MatchesTiktokenReference) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const auto path =
      std::filesystem::path(LATTICE_REFERENCE_DIR) / "data" / "tokenizer_gpt2_reference.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing " << path;
  const nlohmann::json reference = nlohmann::json::parse(in);
  const auto& texts = reference["texts"];
  ASSERT_GE(texts.size(), 20u);
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const bool allow = reference["allow_special"][i].get<bool>();
    const Ids expected = reference["ids"][i].get<Ids>();
    EXPECT_EQ(gpt2().encode(text, allow), expected) << "text " << i << ": " << text;
    EXPECT_EQ(gpt2().decode(expected), text) << "text " << i;
  }
}

TEST(TokenizerGpt2, RandomBytesRoundTrip) {
  LATTICE_SKIP_WITHOUT_GPT2();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string bytes = testing::random_bytes(rng, 1 + trial * 7 % 400);
    const Ids ids = gpt2().encode(bytes);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 50256);
    ASSERT_EQ(gpt2().decode(ids), bytes) << "trial " << trial;
  }
  // Every single byte value, and a long run that takes the heap-ordered merge path.
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(gpt2().decode(gpt2().encode(all)), all);
  const std::string long_run = std::string(5000, ' ') + "x" + std::string(3000, 'a');
  EXPECT_EQ(gpt2().decode(gpt2().encode(long_run)), long_run);
}

TEST(TokenizerGpt2, ConcurrentEncodesAgreeWithSerial) {
  LATTICE_SKIP_WITHOUT_GPT2();
  // One tokenizer shared by threads (as `lattice data prepare` does): same ids as one thread.
  const BpeTokenizer fresh(gpt2().model());  // cold cache, filled concurrently
  std::mt19937 rng(77);
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) texts.push_back(testing::random_bytes(rng, 20000));
  std::vector<Ids> expected;
  for (const auto& text : texts) expected.push_back(gpt2().encode(text));
  std::vector<Ids> got(texts.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < texts.size(); i += 4) got[i] = fresh.encode(texts[i]);
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(got, expected);
}

TEST(TokenizerGpt2, DecodeEndingInsideUtf8Character) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const std::string text = "smile 😀";  // the emoji is 4 bytes, split over byte-level tokens
  const Ids ids = gpt2().encode(text);
  ASSERT_GE(ids.size(), 3u);
  const std::string partial = gpt2().decode(std::span<const int32_t>(ids.data(), ids.size() - 1));
  EXPECT_TRUE(text.starts_with(partial));
  EXPECT_LT(partial.size(), text.size());
  EXPECT_THROW(gpt2().decode(Ids{50257}), Error);
  EXPECT_THROW(gpt2().decode(Ids{-1}), Error);
}

TEST(TokenizerGpt2, StreamingDecoderHoldsPartialCharacters) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const std::string text = "a😀b日本語 end 👍🏽";
  const Ids ids = gpt2().encode(text);
  StreamingDecoder decoder(gpt2());
  std::string printed;
  for (int32_t id : ids) {
    const std::string chunk = decoder.push(id);
    // Everything printed so far is a prefix of the text that ends on a character boundary.
    printed += chunk;
    ASSERT_TRUE(text.starts_with(printed));
    if (printed.size() < text.size()) {
      EXPECT_NE(static_cast<unsigned char>(text[printed.size()]) & 0xC0, 0x80);
    }
  }
  printed += decoder.flush();
  EXPECT_EQ(printed, text);
  // A sequence ending inside a character: flush returns the partial bytes.
  StreamingDecoder cut(gpt2());
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += cut.push(ids[i]);
  out += cut.flush();
  EXPECT_EQ(out, gpt2().decode(std::span<const int32_t>(ids.data(), ids.size() - 1)));
}

TEST(TokenizerGpt2, LoadTokenizerSpecs) {
  LATTICE_SKIP_WITHOUT_GPT2();
  const std::string text = "Hello, world! It's 2026 — naïve café 😀  \n\n done";
  const Ids expected = gpt2().encode(text);
  EXPECT_EQ(load_tokenizer(testing::gpt2_dir().string())->encode(text), expected);
  EXPECT_EQ(load_tokenizer((testing::gpt2_dir() / "encoder.json").string())->encode(text),
            expected);
  EXPECT_EQ(load_tokenizer("byte")->encode("ab"), (Ids{97, 98}));
  EXPECT_THROW(load_tokenizer("/nonexistent/tokenizer.json"), Error);
  testing::TempDir empty;
  EXPECT_THROW(load_tokenizer(empty.path().string()), Error);
}

TEST(TokenizerGpt2, ConvertedFilesEncodeTheSame) {
  LATTICE_SKIP_WITHOUT_GPT2();
  testing::TempDir dir;
  const BpeModel& model = gpt2().model();
  write_tokenizer_json(model, dir / "tokenizer.json");
  write_tiktoken(model, dir / "gpt2.tiktoken");
  std::filesystem::create_directories(dir / "hf");
  write_vocab_and_merges(model, dir / "hf/vocab.json", dir / "hf/merges.txt");

  std::mt19937 rng(99);
  std::vector<std::string> texts = {"hello <|endoftext|> world", "It's 1,234 — ok?\n\n  x"};
  for (int i = 0; i < 20; ++i) texts.push_back(testing::random_bytes(rng, 200));
  for (const std::string& spec :
       {(dir / "tokenizer.json").string(), (dir / "gpt2.tiktoken").string(), (dir / "hf").string(),
        dir.path().string()}) {
    SCOPED_TRACE(spec);
    const auto loaded = load_tokenizer(spec);
    EXPECT_EQ(loaded->vocab_size(), 50257);
    EXPECT_EQ(loaded->end_of_text(), 50256);
    for (const auto& text : texts) {
      EXPECT_EQ(loaded->encode(text), gpt2().encode(text));
      EXPECT_EQ(loaded->encode(text, true), gpt2().encode(text, true));
    }
  }
}

}  // namespace
}  // namespace lattice::data
