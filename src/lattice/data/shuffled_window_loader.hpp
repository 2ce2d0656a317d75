// ShuffledWindowLoader: training samples from a token stream. The stream is cut into windows of
// seq_len + 1 tokens that overlap by one (window w starts at token w·seq_len), so every token is a
// target once per epoch. Sample n of the global stream is window perm_e(n mod W) of epoch
// e = n / W, where perm_e is a pseudo-random permutation of [0, W) drawn from (seed, e) alone. The
// loader's whole state is therefore the number of samples consumed: data-parallel ranks that take
// disjoint index ranges read disjoint windows, and a checkpoint that saves the count resumes on
// the same next batch.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/data/token_source.hpp"

namespace lattice::data {

// A bijection of [0, size) keyed by `key` (a Feistel network with cycle walking; no table).
class IndexPermutation {
 public:
  IndexPermutation(uint64_t size, uint64_t key);
  uint64_t operator()(uint64_t index) const;

 private:
  uint64_t size_, key_;
  int half_bits_;
  uint64_t half_mask_;
};

class ShuffledWindowLoader {
 public:
  // shuffle = false reads windows in order (validation). Throws when the source holds fewer than
  // seq_len + 1 tokens, naming `what` (e.g. "the validation split").
  ShuffledWindowLoader(const TokenSource& source, int64_t seq_len, uint64_t seed, bool shuffle,
                       const std::string& what);

  int64_t windows_per_epoch() const { return windows_; }
  // The first token of sample n's window.
  int64_t window_start(int64_t n) const;
  // Inputs and targets (inputs shifted by one) of sample n, seq_len each.
  void sample(int64_t n, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenSource& source_;
  int64_t seq_len_, windows_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace lattice::data
