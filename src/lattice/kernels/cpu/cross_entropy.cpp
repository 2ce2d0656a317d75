// Fused softmax + cross-entropy: see cross_entropy.hpp. Per row: one sweep for the max (the only
// read from memory), one sweep that stores e^(x - max) into the gradient row and sums it, one sweep
// that scales it; a row of 50257 floats (200 KB) stays in L2 between sweeps. Rows spread over
// OpenMP threads; row losses are kept and summed in row order in double, independent of the thread
// count.
#include "lattice/kernels/cpu/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/softmax_rows.hpp"

namespace lattice::kernels {

namespace {

using softmax_rows::row_max;
using softmax_rows::sum_exp;

void check_arguments(const char* op, const int32_t* targets, int64_t rows, int64_t V) {
  check(rows >= 0 && V > 0, std::string(op) + ": needs rows >= 0 and V > 0, got rows=" +
                                std::to_string(rows) + " V=" + std::to_string(V));
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= V) {  // message built only on failure: this loop runs every step
      throw Error(std::string(op) + ": target " + std::to_string(targets[r]) + " at row " +
                  std::to_string(r) + " is outside the vocabulary of size " + std::to_string(V) +
                  "; check the data's vocab size against the model's");
    }
  }
}

double sum_in_row_order(const std::vector<double>& row_losses) {
  double total = 0.0;
  for (double loss : row_losses) total += loss;
  return total;
}

}  // namespace

double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows, int64_t V) {
  check_arguments("cross_entropy_forward", targets, rows, V);
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = targets[r];
    if (target < 0) continue;
    const float* x = logits + r * V;
    const float max = row_max(x, V);
    const double total = sum_exp(nullptr, x, max, V);
    row_losses[r] = static_cast<double>(max) + std::log(total) - static_cast<double>(x[target]);
  }
  return sum_in_row_order(row_losses);
}

double cross_entropy_forward_backward(float* d_logits, const float* logits, const int32_t* targets,
                                      int64_t rows, int64_t V, float grad_scale) {
  check_arguments("cross_entropy_forward_backward", targets, rows, V);
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = targets[r];
    float* g = d_logits + r * V;
    if (target < 0) {
      std::fill(g, g + V, 0.0f);
      continue;
    }
    const float* x = logits + r * V;
    const float target_logit = x[target];  // read before g (possibly x itself) is overwritten
    const float max = row_max(x, V);
    const double total = sum_exp(g, x, max, V);
    row_losses[r] = static_cast<double>(max) + std::log(total) - static_cast<double>(target_logit);
    const float scale = static_cast<float>(static_cast<double>(grad_scale) / total);
#pragma omp simd simdlen(16)
    for (int64_t v = 0; v < V; ++v) g[v] *= scale;
    g[target] -= grad_scale;
  }
  return sum_in_row_order(row_losses);
}

void cross_entropy_rows_bf16(lattice::bf16* d_logits, double* row_losses, const float* logits,
                             const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                             float* work, int64_t row_stride) {
  check(row_stride >= V, "cross_entropy_rows_bf16: row_stride " + std::to_string(row_stride) +
                             " is below the vocabulary size " + std::to_string(V));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = targets[r];
    const float* x = logits + r * row_stride;
    lattice::bf16* d = d_logits != nullptr ? d_logits + r * row_stride : nullptr;
    if (target < 0) {
      if (d != nullptr) std::fill(d, d + V, lattice::bf16{0});
      row_losses[r] = 0.0;
      continue;
    }
    const float max = row_max(x, V);
    if (d == nullptr) {
      const double total = sum_exp(nullptr, x, max, V);
      row_losses[r] = static_cast<double>(max) + std::log(total) - static_cast<double>(x[target]);
      continue;
    }
    // The fp32 gradient row is formed in `work`, which stays in cache, with the operations of
    // cross_entropy_forward_backward, then rounded: the logits are only read.
    const double total = sum_exp(work, x, max, V);
    row_losses[r] = static_cast<double>(max) + std::log(total) - static_cast<double>(x[target]);
    // d = bf16(exp · scale), and at the target bf16(exp · scale - grad_scale): the fp32 values of
    // cross_entropy_forward_backward, scaled and rounded in one pass.
    const float scale = static_cast<float>(static_cast<double>(grad_scale) / total);
    // volatile: the product is rounded to fp32 before the subtraction (never contracted to an FMA).
    const volatile float scaled = work[target] * scale;
    convert_scaled_to_bf16_on_this_thread(d, work, scale, V);
    d[target] = lattice::to_bf16(scaled - grad_scale);
  }
}

double cross_entropy_forward_backward_bf16(lattice::bf16* d_logits, const float* logits,
                                           const int32_t* targets, int64_t rows, int64_t V,
                                           float grad_scale) {
  check_arguments("cross_entropy_forward_backward_bf16", targets, rows, V);
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
#pragma omp parallel
  {
    std::vector<float> work(static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      cross_entropy_rows_bf16(d_logits + r * V, &row_losses[static_cast<size_t>(r)], logits + r * V,
                              targets + r, 1, V, grad_scale, work.data(), V);
  }
  return sum_in_row_order(row_losses);
}

}  // namespace lattice::kernels
