// Tokenizer file formats, written by hand here (not by Lattice's writers): a tiny vocabulary in
// each format encodes as worked out by hand, and each malformed file gives one error that names
// the file and the problem.
#include <gtest/gtest.h>

#include <functional>

#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer.hpp"
#include "test_tokenizer_util.hpp"

namespace lattice::data {
namespace {

using Ids = std::vector<int32_t>;
using testing::TempDir;
using testing::write_text;

// GPT-2's bytes_to_unicode, as in its encoder.py, spelled as a UTF-8 JSON string body.
std::string spell(const std::string& bytes) {
  std::vector<int> printable;
  for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  std::string out;
  for (unsigned char c : bytes) {
    int cp = c;
    if (std::find(printable.begin(), printable.end(), c) == printable.end()) {
      int n = 0;
      for (int b = 0; b < c; ++b)
        if (std::find(printable.begin(), printable.end(), b) == printable.end()) ++n;
      cp = 256 + n;
    }
    if (cp == '"' || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::string base64(const std::string& bytes) {
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    out += a[v >> 18];
    out += a[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? a[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? a[v & 63] : '=';
  }
  return out;
}

// The tiny vocabulary: bytes (id = byte value), then "ab" 256, "abc" 257, " a" 258, " ab" 259,
// <|endoftext|> 260. Merges: Ġ a, Ġa b, a b, ab c (so " ab" is one token; in the other order
// "a b" would merge first and " ab" would stay " " + "ab").
const std::vector<std::pair<std::string, int>> kMerged = {
    {"ab", 256}, {"abc", 257}, {" a", 258}, {" ab", 259}};
const char* kMerges = "#version: 0.2\nĠ a\nĠa b\na b\nab c\n";

std::string vocab_json(int skip_byte = -1) {
  std::string json = "{";
  for (int b = 0; b < 256; ++b) {
    if (b == skip_byte) continue;
    json += "\"" + spell(std::string(1, static_cast<char>(b))) + "\": " + std::to_string(b) + ", ";
  }
  for (const auto& [bytes, id] : kMerged)
    json += "\"" + spell(bytes) + "\": " + std::to_string(id) + ", ";
  return json + "\"<|endoftext|>\": 260}";
}

std::string tokenizer_json(
    const std::string& model_type = "BPE",
    const std::string& pre =
        R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})",
    const std::string& merges = R"([["Ġ", "a"], "Ġa b", "a b", "ab c"])",
    const std::string& normalizer = "null") {
  return R"({"version": "1.0", "added_tokens": [{"id": 260, "content": "<|endoftext|>", "special": true}],
  "normalizer": )" +
         normalizer + R"(, "pre_tokenizer": )" + pre + R"(,
  "model": {"type": ")" +
         model_type + R"(", "vocab": )" + vocab_json() + R"(, "merges": )" + merges + "}}";
}

std::string tiktoken_file() {
  std::string text;
  for (int b = 0; b < 256; ++b)
    text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  for (const auto& [bytes, id] : kMerged) text += base64(bytes) + " " + std::to_string(id) + "\n";
  return text;
}

void expect_tiny_encodings(const Tokenizer& tok) {
  EXPECT_EQ(tok.vocab_size(), 261);
  EXPECT_EQ(tok.end_of_text(), 260);
  EXPECT_EQ(tok.encode("abc ab abd"), (Ids{257, 259, 259, 'd'}));
  EXPECT_EQ(tok.encode("xab<|endoftext|>", true), (Ids{'x', 256, 260}));
  EXPECT_EQ(tok.decode(Ids{257, 259, 260}), "abc ab<|endoftext|>");
}

// Runs `load`, expecting one lattice::Error whose message holds each of `parts`.
void expect_error(const std::function<void()>& load, const std::vector<std::string>& parts) {
  try {
    load();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

TEST(TokenizerFiles, VocabAndMerges) {
  TempDir dir;
  write_text(dir / "vocab.json", vocab_json());
  write_text(dir / "merges.txt", kMerges);
  expect_tiny_encodings(*load_tokenizer(dir.path().string()));
  expect_tiny_encodings(*load_tokenizer((dir / "vocab.json").string()));
  TempDir gpt2;  // the same formats under GPT-2's names
  write_text(gpt2 / "encoder.json", vocab_json());
  write_text(gpt2 / "vocab.bpe", kMerges);
  expect_tiny_encodings(*load_tokenizer(gpt2.path().string()));
}

TEST(TokenizerFiles, TokenizerJson) {
  TempDir dir;
  write_text(dir / "tokenizer.json", tokenizer_json());
  expect_tiny_encodings(*load_tokenizer((dir / "tokenizer.json").string()));
  expect_tiny_encodings(*load_tokenizer(dir.path().string()));
  // Split + ByteLevel(use_regex false): the Split's regex is the pattern (here: whole words only,
  // so " ab" is not one piece and the space stays a byte).
  write_text(dir / "split.json", tokenizer_json("BPE", R"({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})"));
  EXPECT_EQ(load_tokenizer((dir / "split.json").string())->encode("abc ab"), (Ids{257, ' ', 256}));
}

TEST(TokenizerFiles, Tiktoken) {
  TempDir dir;
  write_text(dir / "tiny.tiktoken", tiktoken_file());
  expect_tiny_encodings(*load_tokenizer((dir / "tiny.tiktoken").string()));
  write_text(dir / "ranks.txt", tiktoken_file());
  expect_tiny_encodings(*load_tokenizer("tiktoken:" + (dir / "ranks.txt").string()));
}

TEST(TokenizerFiles, MalformedVocabAndMerges) {
  TempDir dir;
  auto load = [&](const std::string& vocab, const std::string& merges) {
    write_text(dir / "vocab.json", vocab);
    write_text(dir / "merges.txt", merges);
    return [&] { load_tokenizer(dir.path().string()); };
  };
  expect_error(load("{\"a\": 1", kMerges), {"vocab.json", "not valid JSON"});
  expect_error(load("[1, 2]", kMerges), {"vocab.json", "not a JSON object"});
  expect_error(load(R"({"a": "1"})", kMerges), {"vocab.json", "'a'", "expected an integer"});
  expect_error(load(R"({"€": 1})", kMerges), {"vocab.json", "byte-level alphabet"});
  expect_error(load(vocab_json('q'), kMerges), {"vocab.json", "0x71", "all 256 bytes"});
  expect_error(load(vocab_json(), "#version: 0.2\na b\nabc\n"),
               {"merges.txt", "line 3", "one space"});
  expect_error(load(vocab_json(), "#version: 0.2\nx y\n"),
               {"vocab.json", "merge 1", "'xy'", "not in the vocabulary"});
  expect_error(load(vocab_json(), "#version: 0.2\n"), {"merges.txt", "no merges"});
  std::string duplicate_id = vocab_json();
  duplicate_id.replace(duplicate_id.rfind("260"), 3, "257");
  expect_error(load(duplicate_id, kMerges), {"vocab.json", "id 257"});
}

TEST(TokenizerFiles, MalformedTokenizerJson) {
  TempDir dir;
  auto load = [&](const std::string& text) {
    write_text(dir / "tokenizer.json", text);
    return [&] { load_tokenizer((dir / "tokenizer.json").string()); };
  };
  expect_error(load("{\"model\": "), {"tokenizer.json", "not valid JSON"});
  expect_error(load("{}"), {"tokenizer.json", "no \"model\""});
  expect_error(load(tokenizer_json("WordPiece")), {"tokenizer.json", "WordPiece", "only BPE"});
  expect_error(load(tokenizer_json("BPE", R"({"type": "Whitespace"})")),
               {"tokenizer.json", "Whitespace", "ByteLevel"});
  expect_error(load(tokenizer_json("BPE", R"({"type": "ByteLevel", "add_prefix_space": true})")),
               {"tokenizer.json", "add_prefix_space"});
  expect_error(load(tokenizer_json("BPE", R"({"type": "ByteLevel"})", R"(["a b", 5])")),
               {"tokenizer.json", "merge 2"});
  expect_error(load(tokenizer_json("BPE", R"({"type": "ByteLevel"})", "[]")),
               {"tokenizer.json", "merges is empty"});
  expect_error(
      load(tokenizer_json("BPE", R"({"type": "ByteLevel"})", R"(["a b"])", R"({"type": "NFC"})")),
      {"tokenizer.json", "NFC", "normalizer"});
  std::string no_content = tokenizer_json();
  no_content.replace(no_content.find("\"content\""), 9, "\"text\"");
  expect_error(load(no_content), {"tokenizer.json", "added_tokens", "content"});
}

TEST(TokenizerFiles, MalformedTiktoken) {
  TempDir dir;
  auto load = [&](const std::string& text) {
    write_text(dir / "bad.tiktoken", text);
    return [&] { load_tokenizer((dir / "bad.tiktoken").string()); };
  };
  expect_error(load(""), {"bad.tiktoken", "no ranks"});
  expect_error(load("YQ==\n"), {"bad.tiktoken", "line 1", "<base64 token> <rank>"});
  expect_error(load("Y!== 3\n"), {"bad.tiktoken", "line 1", "base64"});
  expect_error(load("YQ== x3\n"), {"bad.tiktoken", "line 1", "rank"});
  expect_error(load("YQ== 0\n"), {"bad.tiktoken", "all 256 bytes"});
  std::string duplicate = tiktoken_file() + base64("zz") + " 256\n";
  expect_error(load(duplicate), {"bad.tiktoken", "id 256"});
}

TEST(TokenizerFiles, LoadTokenizerErrorsNameTheSpec) {
  expect_error([] { load_tokenizer("/no/such/dir"); }, {"/no/such/dir", "no such file"});
  TempDir dir;
  write_text(dir / "model.bin", "x");
  expect_error([&] { load_tokenizer((dir / "model.bin").string()); },
               {"model.bin", "unknown tokenizer file"});
  expect_error([&] { load_tokenizer(dir.path().string()); }, {"tokenizer.json", "encoder.json"});
}

}  // namespace
}  // namespace lattice::data
