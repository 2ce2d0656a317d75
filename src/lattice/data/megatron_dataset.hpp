// Megatron-LM indexed datasets (MMapIndexedDataset): `<prefix>.idx` holds the index — the magic
// "MMIDIDX\0\0", a uint64 version (1), a uint8 dtype code, uint64 sequence and document counts,
// int32 sequence lengths, int64 byte pointers into `.bin`, int64 document boundaries — and
// `<prefix>.bin` the tokens of every sequence back to back. Reader (memory-mapped, the sequences
// read as one token stream) and writer (for tests and conversions), both byte-compatible with
// Megatron's indexed_dataset.py.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lattice/data/mapped_file.hpp"
#include "lattice/data/token_array.hpp"
#include "lattice/data/token_source.hpp"

namespace lattice::data {

// Megatron's dtype codes (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6 and 7 are
// floating point and refused).
TokenType megatron_token_type(uint8_t code, const std::string& file);
uint8_t megatron_dtype_code(TokenType type);

struct MegatronIndex {
  TokenType type = TokenType::uint16;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;  // byte offsets into .bin
  std::vector<int64_t> document_indices;   // sequence boundaries: 0, ..., sequence count
  int64_t total_tokens() const;
};

// Parses and checks an .idx file held in `bytes` against a .bin of `bin_bytes` bytes. Throws
// lattice::Error naming `name` and what is wrong (truncated, bad magic or version, unknown dtype,
// pointers that are not the sequences back to back, a .bin size that does not match, no tokens).
MegatronIndex parse_megatron_index(std::span<const uint8_t> bytes, int64_t bin_bytes,
                                   const std::string& name);

// Writes `<prefix>.bin` and `<prefix>.idx` atomically: one sequence per document (Megatron's
// default), ids stored as `type`.
void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& documents, TokenType type);

// A memory-mapped Megatron dataset read as one stream of tokens (the sequences in order).
// vocab_size > 0: every id is checked against it on open.
class MegatronDataset final : public TokenSource {
 public:
  MegatronDataset(const std::string& prefix, int64_t vocab_size);
  int64_t size() const override { return tokens_.count; }
  int64_t vocab_size() const override { return vocab_size_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    tokens_.read(offset, count, out);
  }
  const MegatronIndex& index() const { return index_; }

 private:
  MappedFile bin_, idx_;
  MegatronIndex index_;
  TokenArray tokens_;
  int64_t vocab_size_;
};

}  // namespace lattice::data
