// llm.c shards: see llmc_shard.hpp.
#include "lattice/data/llmc_shard.hpp"

#include <array>
#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::data {

TokenArray parse_llmc_shard(std::span<const uint8_t> file, const std::string& name) {
  check(static_cast<int64_t>(file.size()) >= kLlmcHeaderBytes,
        "llm.c shard " + name + " is truncated: " + std::to_string(file.size()) +
            " bytes, shorter than the 1024-byte header; regenerate it");
  std::array<int32_t, 3> header{};
  std::memcpy(header.data(), file.data(), sizeof(header));
  TokenArray tokens;
  if (header[0] == kLlmcMagicUint16) {
    check(header[1] == 1, "llm.c shard " + name + " has version " + std::to_string(header[1]) +
                              " for magic 20240520 (uint16 tokens): only version 1 exists");
    tokens.type = TokenType::uint16;
  } else if (header[0] == kLlmcMagicUint32) {
    check(header[1] == 7 || header[1] == 2,
          "llm.c shard " + name + " has version " + std::to_string(header[1]) +
              " for magic 20240801 (uint32 tokens): expected 7 (llm.c) or 2");
    tokens.type = TokenType::uint32;
  } else {
    throw Error("file " + name + " is not an llm.c token shard: bad magic " +
                std::to_string(header[0]) +
                " (expected 20240520 or 20240801); check data.format and the path");
  }
  const int64_t count = header[2];
  const int64_t payload = static_cast<int64_t>(file.size()) - kLlmcHeaderBytes;
  const int64_t width = token_type_size(tokens.type);
  check(count >= 0 && payload == count * width,
        "llm.c shard " + name + ": the header says " + std::to_string(count) + " tokens (" +
            std::to_string(count * width) + " bytes) but the file holds " +
            std::to_string(payload) +
            " bytes after the header; the file is truncated or "
            "corrupt, regenerate it");
  check(count > 0, "llm.c shard " + name + " holds no tokens: remove it or regenerate it");
  tokens.data = file.data() + kLlmcHeaderBytes;
  tokens.count = count;
  return tokens;
}

TokenType llmc_token_type_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenType::uint16 : TokenType::uint32;
}

void write_llmc_shard(const std::string& path, std::span<const int32_t> tokens, TokenType type) {
  check(type == TokenType::uint16 || type == TokenType::uint32,
        "llm.c shards hold uint16 or uint32 tokens, not " + token_type_name(type));
  check(tokens.size() <= static_cast<size_t>(INT32_MAX),
        "an llm.c shard holds at most 2^31-1 tokens: lower the shard size");
  std::array<int32_t, 256> header{};
  const bool narrow = type == TokenType::uint16;
  header[0] = narrow ? kLlmcMagicUint16 : kLlmcMagicUint32;
  header[1] = narrow ? 1 : 7;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFileWriter out(path);
  out.write(header.data(), sizeof(header));
  const int64_t limit = narrow ? 65536 : (int64_t{1} << 32);
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint8_t> buffer;
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t end = std::min(tokens.size(), begin + kChunk);
    buffer.resize((end - begin) * (narrow ? 2 : 4));
    for (size_t i = begin; i < end; ++i) {
      const int64_t id = tokens[i];
      check(id >= 0 && id < limit, "token id " + std::to_string(id) + " does not fit an llm.c " +
                                       token_type_name(type) + " shard (" + path + ")");
      if (narrow) {
        const auto v = static_cast<uint16_t>(id);
        std::memcpy(buffer.data() + (i - begin) * 2, &v, 2);
      } else {
        const auto v = static_cast<uint32_t>(id);
        std::memcpy(buffer.data() + (i - begin) * 4, &v, 4);
      }
    }
    out.write(buffer.data(), buffer.size());
  }
  out.commit();
}

LlmcShard::LlmcShard(const std::string& path, int64_t vocab_size)
    : file_(path), tokens_(parse_llmc_shard(file_.bytes(), path)), vocab_size_(vocab_size) {
  if (vocab_size > 0)
    tokens_.check_ids(vocab_size, path);
  else
    vocab_size_ = tokens_.type == TokenType::uint16 ? 65536 : (int64_t{1} << 31) - 1;
}

}  // namespace lattice::data
