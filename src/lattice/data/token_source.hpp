// TokenSource: a read-only sequence of token ids (a corpus already tokenised), the interface the
// batch sampler reads windows from. Byte corpora implement it today; token files (llm.c, Megatron)
// will too.
#pragma once

#include <cstdint>

namespace lattice::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;        // number of tokens
  virtual int64_t vocab_size() const = 0;  // every id is in [0, vocab_size)
  // Copies tokens [offset, offset + count) into out; the range must lie inside the source.
  virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;
};

}  // namespace lattice::data
