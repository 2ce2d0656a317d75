// Test helper: reproducible uniform values in [-scale, scale) (core/rng.hpp), for the model tests'
// inputs and output gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/core/rng.hpp"

namespace lattice::testing {

inline std::vector<float> random_values(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * (2.0f * rng.uniform() - 1.0f);
  return v;
}

}  // namespace lattice::testing
