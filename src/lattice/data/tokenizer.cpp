// Tokenizer: see tokenizer.hpp.
#include "lattice/data/tokenizer.hpp"

#include <filesystem>
#include <utility>

#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer_files.hpp"

namespace lattice::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0 && ids[i] < 256, "token id " + std::to_string(ids[i]) +
                                           " is outside the byte vocabulary [0, 256)");
    bytes[i] = static_cast<char>(ids[i]);
  }
  return bytes;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  namespace fs = std::filesystem;
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  const std::string forms =
      "use \"byte\", a tokenizer.json, a .tiktoken file, encoder.json / vocab.json (with "
      "vocab.bpe / merges.txt beside it) or a directory holding one of these";
  const bool tiktoken_prefix = spec.starts_with("tiktoken:");
  const fs::path path = tiktoken_prefix ? fs::path(spec.substr(9)) : fs::path(spec);
  std::error_code ec;
  check(fs::exists(path, ec),
        "data.tokenizer '" + spec + "': no such file or directory; " + forms);
  if (tiktoken_prefix || path.extension() == ".tiktoken")
    return make_bpe_tokenizer(read_tiktoken(path), path.string());
  auto pair = [](const fs::path& vocab, const fs::path& merges) {
    return make_bpe_tokenizer(read_vocab_and_merges(vocab, merges), vocab.string());
  };
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "tokenizer.json"))
      return make_bpe_tokenizer(read_tokenizer_json(path / "tokenizer.json"),
                                (path / "tokenizer.json").string());
    if (fs::exists(path / "encoder.json") && fs::exists(path / "vocab.bpe"))
      return pair(path / "encoder.json", path / "vocab.bpe");
    if (fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt"))
      return pair(path / "vocab.json", path / "merges.txt");
    throw Error("data.tokenizer '" + spec +
                "': the directory holds no tokenizer.json, encoder.json + vocab.bpe or vocab.json "
                "+ merges.txt; " + forms);
  }
  if (path.filename() == "encoder.json") return pair(path, path.parent_path() / "vocab.bpe");
  if (path.filename() == "vocab.json") return pair(path, path.parent_path() / "merges.txt");
  if (path.extension() == ".json")
    return make_bpe_tokenizer(read_tokenizer_json(path), path.string());
  throw Error("data.tokenizer '" + spec + "': unknown tokenizer file type; " + forms);
}

// Length of the incomplete UTF-8 sequence at the end of `bytes` (0 when it ends on a boundary or
// with bytes that can never start a valid character, which are printed as they are).
static size_t incomplete_utf8_tail(const std::string& bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = 0;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

std::string StreamingDecoder::push(int32_t id) {
  pending_ += tokenizer_.decode(std::span<const int32_t>(&id, 1));
  const size_t hold = incomplete_utf8_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamingDecoder::flush() { return std::exchange(pending_, std::string()); }

}  // namespace lattice::data
