// WindowSampler: see window_sampler.hpp.
#include "lattice/data/window_sampler.hpp"

#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::data {

WindowSampler::WindowSampler(const TokenSource& source, int64_t seq_len, uint64_t seed)
    : source_(source), seq_len_(seq_len), seed_(seed) {
  check(seq_len > 0, "training.seq_len must be positive");
  check(source.size() > seq_len,
        "the corpus split has " + std::to_string(source.size()) +
            " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1) +
            ": add data or lower training.seq_len");
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void WindowSampler::sample(int64_t n, int32_t* inputs, int32_t* targets) const {
  const auto starts = static_cast<uint64_t>(source_.size() - seq_len_);  // valid window starts
  const auto start = static_cast<int64_t>(mix(seed_ ^ mix(static_cast<uint64_t>(n))) % starts);
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  source_.read(start, seq_len_ + 1, window.data());
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = window[static_cast<size_t>(t)];
    targets[t] = window[static_cast<size_t>(t + 1)];
  }
}

void WindowSampler::next(int32_t* inputs, int32_t* targets, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b)
    sample(position_ + b, inputs + b * seq_len_, targets + b * seq_len_);
  position_ += batch;
}

}  // namespace lattice::data
