// ShuffledWindowLoader: see shuffled_window_loader.hpp.
#include "lattice/data/shuffled_window_loader.hpp"

#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::data {

namespace {
uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

IndexPermutation::IndexPermutation(uint64_t size, uint64_t key) : size_(size), key_(mix64(key)) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < size) ++bits;
  half_bits_ = (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t IndexPermutation::operator()(uint64_t index) const {
  uint64_t x = index;
  do {  // cycle walking: the network permutes [0, 4^half_bits); repeat until inside [0, size)
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = mix64(right ^ mix64(key_ + round)) & half_mask_;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= size_);
  return x;
}

ShuffledWindowLoader::ShuffledWindowLoader(const TokenSource& source, int64_t seq_len,
                                           uint64_t seed, bool shuffle, const std::string& what)
    : source_(source), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  check(seq_len > 0, "training.seq_len must be positive");
  check(source.size() > seq_len,
        what + " has " + std::to_string(source.size()) + " tokens, fewer than seq_len + 1 = " +
            std::to_string(seq_len + 1) + ": add data or lower training.seq_len");
  windows_ = (source.size() - 1) / seq_len;
}

int64_t ShuffledWindowLoader::window_start(int64_t n) const {
  check(n >= 0, "sample index must not be negative");
  const auto epoch = static_cast<uint64_t>(n / windows_);
  const auto index = static_cast<uint64_t>(n % windows_);
  if (!shuffle_) return static_cast<int64_t>(index) * seq_len_;
  const IndexPermutation permutation(static_cast<uint64_t>(windows_),
                                     mix64(seed_) ^ mix64(epoch + 0x5eed));
  return static_cast<int64_t>(permutation(index)) * seq_len_;
}

void ShuffledWindowLoader::sample(int64_t n, int32_t* inputs, int32_t* targets) const {
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  source_.read(window_start(n), seq_len_ + 1, window.data());
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = window[static_cast<size_t>(t)];
    targets[t] = window[static_cast<size_t>(t + 1)];
  }
}

}  // namespace lattice::data
