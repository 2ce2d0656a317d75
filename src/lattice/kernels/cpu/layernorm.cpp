// LayerNorm forward and backward over the last dimension: see layernorm.hpp. Each row is read from
// memory once (later sweeps over the row hit L1/L2); rows are spread over OpenMP threads; the
// parameter gradients are reduced over a fixed row partition so they do not depend on the thread
// count.
#include "lattice/kernels/cpu/layernorm.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {

namespace {

void check_shape(const char* op, int64_t rows, int64_t C) {
  check(rows >= 0 && C > 0, std::string(op) + ": needs rows >= 0 and C > 0, got rows=" +
                                std::to_string(rows) + " C=" + std::to_string(C));
}

// One row of the forward: y = (x - mean) * rstd * weight + bias; the one definition both forwards
// use, so the bf16 output is exactly the rounded fp32 one.
inline void layernorm_row(float* y, float& mean, float& rstd, const float* x, const float* weight,
                          const float* bias, int64_t C, float inv_C, float eps) {
  float sum = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += x[c];
  const float m = sum * inv_C;
  // Two-pass variance about the mean: no cancellation when |mean| >> std.
  float squares = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : squares)
  for (int64_t c = 0; c < C; ++c) {
    const float d = x[c] - m;
    squares += d * d;
  }
  const float s = 1.0f / std::sqrt(squares * inv_C + eps);
#pragma omp simd simdlen(16)
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  mean = m;
  rstd = s;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t C, float eps) {
  check_shape("layernorm_forward", rows, C);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    layernorm_row(out + r * C, mean[r], rstd[r], in + r * C, weight, bias, C, inv_C, eps);
}

void layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                            const float* weight, const float* bias, int64_t rows, int64_t C,
                            float eps) {
  check_shape("layernorm_forward_bf16", rows, C);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));  // one fp32 row, in L1, rounded as it leaves
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      layernorm_row(row.data(), mean[r], rstd[r], in + r * C, weight, bias, C, inv_C, eps);
      convert_to_bf16_on_this_thread(out + r * C, row.data(), C);
    }
  }
}

void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                        const float* in, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t C, const float* residual_grad) {
  check_shape("layernorm_backward", rows, C);
  if (rows == 0) return;
  const RowChunks chunks = fixed_row_chunks(rows);
  // Per chunk: C partial sums for d_weight, then C for d_bias (zeroed by the chunk's thread).
  const std::unique_ptr<float[]> partials(new float[static_cast<size_t>(chunks.count * 2 * C)]);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks.count; ++chunk) {
    float* partial_weight = partials.get() + chunk * 2 * C;
    float* partial_bias = partial_weight + C;
    std::fill(partial_weight, partial_weight + 2 * C, 0.0f);
    for (int64_t r = chunks.begin(chunk); r < chunks.end(chunk, rows); ++r) {
      const float* x = in + r * C;
      const float* dy = d_out + r * C;
      float* dx = d_in + r * C;
      const float m = mean[r];
      const float s = rstd[r];
      float sum_dnorm = 0.0f;
      float sum_dnorm_xhat = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sum_dnorm, sum_dnorm_xhat)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        const float dnorm = dy[c] * weight[c];
        sum_dnorm += dnorm;
        sum_dnorm_xhat += dnorm * xhat;
        partial_weight[c] += dy[c] * xhat;
        partial_bias[c] += dy[c];
      }
      const float mean_dnorm = sum_dnorm * inv_C;
      const float mean_dnorm_xhat = sum_dnorm_xhat * inv_C;
#pragma omp simd simdlen(16)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        const float dnorm = dy[c] * weight[c];
        dx[c] = s * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat);
      }
      // The residual in a second loop over the row (in L1): in the loop above the compiler would
      // contract it into an FMA, and the sum would differ from a separate add.
      if (residual_grad != nullptr) {
        const float* dr = residual_grad + r * C;
#pragma omp simd simdlen(16)
        for (int64_t c = 0; c < C; ++c) dx[c] += dr[c];
      }
    }
  }
  add_chunk_partials(d_weight, partials.get(), chunks.count, 2 * C, C);
  add_chunk_partials(d_bias, partials.get() + C, chunks.count, 2 * C, C);
}

}  // namespace lattice::kernels
