// Token and position embedding forward and backward: see embedding.hpp. The backward groups token
// positions by vocabulary row (a stable sort, so each group stays in token order) and gives whole
// groups to threads: every d_wte row is summed in token order, exactly as one serial loop would,
// for any thread count. d_wpe rows are summed over the batch in order b = 0, 1, ... the same way.
#include "lattice/kernels/cpu/embedding.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t pos_offset, VocabRange vocab) {
  check(B >= 0 && T >= 0 && C > 0 && pos_offset >= 0,
        "embedding_forward: needs B, T, pos_offset >= 0 and C > 0, got B=" + std::to_string(B) +
            " T=" + std::to_string(T) + " C=" + std::to_string(C) +
            " pos_offset=" + std::to_string(pos_offset));
  const int64_t N = B * T;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* y = out + i * C;
    const int64_t token = tokens[i];
    if (!vocab.contains(token)) {  // another rank's row: zero (+ the position's)
      if (wpe == nullptr)
        std::memset(y, 0, static_cast<size_t>(C) * sizeof(float));
      else
        std::memcpy(y, wpe + (pos_offset + i % T) * C, static_cast<size_t>(C) * sizeof(float));
      continue;
    }
    const float* token_row = wte + (token - vocab.begin) * C;
    if (wpe == nullptr) {
      std::memcpy(y, token_row, static_cast<size_t>(C) * sizeof(float));
      continue;
    }
    const float* position_row = wpe + (pos_offset + i % T) * C;
#pragma omp simd simdlen(16)
    for (int64_t c = 0; c < C; ++c) y[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(float* d_wte, float* d_wpe, const float* d_out, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, VocabRange vocab) {
  check(B >= 0 && T >= 0 && C > 0,
        "embedding_backward: needs B, T >= 0 and C > 0, got B=" + std::to_string(B) +
            " T=" + std::to_string(T) + " C=" + std::to_string(C));
  const int64_t N = B * T;
  if (N == 0) return;

  // Positions sorted by token id; equal ids keep their token order.
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [tokens](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  // Groups of equal ids inside `vocab` (sorted by id, so they are contiguous).
  std::vector<int64_t> group_starts;
  int64_t end = N;
  for (int64_t k = 0; k < N; ++k) {
    const int64_t token = tokens[order[k]];
    if (token < vocab.begin) continue;
    if (token >= vocab.end) {
      end = k;
      break;
    }
    if (group_starts.empty() || token != tokens[order[k - 1]]) group_starts.push_back(k);
  }
  const int64_t groups = static_cast<int64_t>(group_starts.size());
  group_starts.push_back(end);

#pragma omp parallel
  {
    // Group sizes vary (repeated tokens), so hand groups out dynamically; the order within a group
    // is fixed, so the result does not depend on which thread takes it.
#pragma omp for schedule(dynamic, 16) nowait
    for (int64_t g = 0; g < groups; ++g) {
      float* dst = d_wte + (tokens[order[group_starts[g]]] - vocab.begin) * C;
      for (int64_t k = group_starts[g]; k < group_starts[g + 1]; ++k) {
        const float* src = d_out + order[k] * C;
#pragma omp simd simdlen(16)
        for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
      }
    }
    if (d_wpe != nullptr) {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        float* dst = d_wpe + t * C;
        for (int64_t b = 0; b < B; ++b) {
          const float* src = d_out + (b * T + t) * C;
#pragma omp simd simdlen(16)
          for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
        }
      }
    }
  }
}

}  // namespace lattice::kernels
