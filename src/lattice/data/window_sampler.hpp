// WindowSampler: deterministic training batches from a TokenSource. Sample n is the window of
// seq_len + 1 tokens starting at a position drawn from (seed, n) alone, so the sampler's whole
// state is the count of samples drawn: saving it in a checkpoint makes a resumed run read the same
// batches.
#pragma once

#include <cstdint>

#include "lattice/data/token_source.hpp"

namespace lattice::data {

class WindowSampler {
 public:
  WindowSampler(const TokenSource& source, int64_t seq_len, uint64_t seed);

  // Fills inputs and targets [batch, seq_len] (targets are inputs shifted by one) with the next
  // `batch` samples.
  void next(int32_t* inputs, int32_t* targets, int64_t batch);
  // The window of sample index n (inputs and targets of one sequence).
  void sample(int64_t n, int32_t* inputs, int32_t* targets) const;

  int64_t position() const { return position_; }
  void set_position(int64_t position) { position_ = position; }

 private:
  const TokenSource& source_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t position_ = 0;
};

}  // namespace lattice::data
