// The row pieces of a softmax shared by the cross-entropy kernels (private to kernels/cpu): a row's
// maximum and its sum of e^(x - max) with fast_exp, in blocks of fp32 added in double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "lattice/kernels/cpu/fast_exp.hpp"

namespace lattice::kernels::softmax_rows {

// Partial sums of e^(x - max) run over blocks of this many elements in fp32 (16 lanes, so 32 terms
// per lane) before they are added in double: the row sum keeps about 1e-7 relative accuracy.
constexpr int64_t kSumBlock = 512;

inline float row_max(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd simdlen(16) reduction(max : m)
  for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
  return m;
}

// sum_v e^(x_v - max); when exps is not null also stores e^(x_v - max) there (exps may alias x).
inline double sum_exp(float* exps, const float* x, float max, int64_t V) {
  double total = 0.0;
  for (int64_t v0 = 0; v0 < V; v0 += kSumBlock) {
    const int64_t v1 = std::min(V, v0 + kSumBlock);
    float block = 0.0f;
    if (exps != nullptr) {
#pragma omp simd simdlen(16) reduction(+ : block)
      for (int64_t v = v0; v < v1; ++v) {
        const float e = fast_exp(x[v] - max);
        exps[v] = e;
        block += e;
      }
    } else {
#pragma omp simd simdlen(16) reduction(+ : block)
      for (int64_t v = v0; v < v1; ++v) block += fast_exp(x[v] - max);
    }
    total += static_cast<double>(block);
  }
  return total;
}

}  // namespace lattice::kernels::softmax_rows
