// TokenArray: a read-only view of token ids stored as little-endian integers of one width (the
// payload of an llm.c shard or a Megatron .bin), read into int32 ids, with the vocabulary check
// every token-file reader runs once when it opens a file.
#pragma once

#include <cstdint>
#include <string>

namespace lattice::data {

enum class TokenType { uint8, int8, int16, uint16, int32, uint32, int64 };

// Bytes per token of `type`, and its name ("uint16").
int64_t token_type_size(TokenType type);
std::string token_type_name(TokenType type);

struct TokenArray {
  const uint8_t* data = nullptr;
  int64_t count = 0;
  TokenType type = TokenType::uint16;

  // Token i (no bounds check: callers check once per read).
  int64_t at(int64_t i) const;
  // Copies tokens [offset, offset + count) into out as int32.
  void read(int64_t offset, int64_t n, int32_t* out) const;
  // Throws lattice::Error naming `file`, the first offending position and id when a token is
  // negative or not below vocab_size.
  void check_ids(int64_t vocab_size, const std::string& file) const;
};

}  // namespace lattice::data
