// Vocabulary-parallel cross-entropy: see cross_entropy_vocab_slice.hpp. Rows spread over OpenMP
// threads; each row's sums are formed as cross_entropy.cpp forms them (softmax_rows.hpp), and the
// row losses are added in row order: independent of the thread count.
#include "lattice/kernels/cpu/cross_entropy_vocab_slice.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"
#include "lattice/kernels/cpu/softmax_rows.hpp"

namespace lattice::kernels {

namespace {

void check_slice(const char* op, int64_t rows, int64_t V_local, int64_t valid) {
  check(rows >= 0 && V_local > 0 && valid >= 0 && valid <= V_local,
        std::string(op) +
            ": needs rows >= 0 and 0 <= valid <= V_local, got rows=" + std::to_string(rows) +
            " V_local=" + std::to_string(V_local) + " valid=" + std::to_string(valid));
}

}  // namespace

void vocab_slice_row_max(float* row_max, const float* logits, int64_t rows, int64_t V_local,
                         int64_t valid) {
  check_slice("vocab_slice_row_max", rows, V_local, valid);
#pragma omp parallel for schedule(static) if (rows * valid > 65536)
  for (int64_t r = 0; r < rows; ++r)
    row_max[r] = valid > 0 ? softmax_rows::row_max(logits + r * V_local, valid)
                           : -std::numeric_limits<float>::infinity();
}

void vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                          const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t V_local, int64_t valid, VocabRange vocab) {
  check_slice("vocab_slice_row_sums", rows, V_local, valid);
#pragma omp parallel for schedule(static) if (rows * valid > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * V_local;
    row_sum[r] =
        valid > 0 ? static_cast<float>(softmax_rows::sum_exp(nullptr, x, row_max[r], valid)) : 0.0f;
    const int64_t target = targets[r];
    target_logit[r] = target >= 0 && vocab.contains(target) ? x[target - vocab.begin] : 0.0f;
  }
}

double vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                        const float* row_sum, const float* target_logit, const int32_t* targets,
                        int64_t rows, int64_t V_local, int64_t valid, VocabRange vocab,
                        float grad_scale) {
  check_slice("vocab_slice_loss", rows, V_local, valid);
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static) if (rows * valid > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = targets[r];
    const float* x = logits + r * V_local;
    float* g = d_logits != nullptr ? d_logits + r * V_local : nullptr;
    if (target < 0) {
      if (g != nullptr) std::fill(g, g + V_local, 0.0f);
      continue;
    }
    row_losses[static_cast<size_t>(r)] = std::log(static_cast<double>(row_sum[r])) +
                                         static_cast<double>(row_max[r]) -
                                         static_cast<double>(target_logit[r]);
    if (g == nullptr) continue;
    const float scale = static_cast<float>(static_cast<double>(grad_scale) / row_sum[r]);
    const float max = row_max[r];
#pragma omp simd simdlen(16)
    for (int64_t v = 0; v < valid; ++v) g[v] = fast_exp(x[v] - max) * scale;
    std::fill(g + valid, g + V_local, 0.0f);
    if (vocab.contains(target)) g[target - vocab.begin] -= grad_scale;
  }
  double total = 0.0;
  for (double loss : row_losses) total += loss;
  return total;
}

}  // namespace lattice::kernels
