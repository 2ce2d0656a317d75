// llm.c token shards: a 1024-byte header of 256 little-endian int32 (header[0] magic, header[1]
// version, header[2] token count) followed by the tokens. Magic 20240520 / version 1 holds uint16
// tokens (GPT-2); magic 20240801 holds uint32 tokens (llm.c writes version 7; version 2 is also
// read). The writer is atomic; the reader memory-maps the file and checks it whole when it opens.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lattice/data/mapped_file.hpp"
#include "lattice/data/token_array.hpp"
#include "lattice/data/token_source.hpp"

namespace lattice::data {

inline constexpr int32_t kLlmcMagicUint16 = 20240520;
inline constexpr int32_t kLlmcMagicUint32 = 20240801;
inline constexpr int64_t kLlmcHeaderBytes = 1024;

// Checks the header and size of an llm.c shard held in `file` and returns its tokens (pointing into
// `file`). Throws lattice::Error naming `name` and what is wrong: too short for the header, bad
// magic or version, a token count that does not match the file size, no tokens.
TokenArray parse_llmc_shard(std::span<const uint8_t> file, const std::string& name);

// Writes `tokens` as an llm.c shard (uint16 or uint32) to `path` atomically. Throws when an id
// does not fit the chosen type.
void write_llmc_shard(const std::string& path, std::span<const int32_t> tokens, TokenType type);

// The token type a vocabulary needs: uint16 when every id fits, else uint32.
TokenType llmc_token_type_for_vocab(int64_t vocab_size);

// A memory-mapped llm.c shard. vocab_size > 0: every id is checked against it on open.
class LlmcShard final : public TokenSource {
 public:
  LlmcShard(const std::string& path, int64_t vocab_size);
  int64_t size() const override { return tokens_.count; }
  int64_t vocab_size() const override { return vocab_size_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    tokens_.read(offset, count, out);
  }
  TokenType token_type() const { return tokens_.type; }

 private:
  MappedFile file_;
  TokenArray tokens_;
  int64_t vocab_size_;
};

}  // namespace lattice::data
