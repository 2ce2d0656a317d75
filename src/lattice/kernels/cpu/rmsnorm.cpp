// RMSNorm forward and backward over the last dimension, as Hugging Face's LlamaRMSNorm in fp32: see
// rmsnorm.hpp. One read of each row from memory; rows spread over OpenMP threads; d_weight reduced
// over a fixed row partition so it does not depend on the thread count.
#include "lattice/kernels/cpu/rmsnorm.hpp"

#include <cmath>
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

// One row of the forward: y = weight * (x * rstd); the one definition both forwards use, so the
// bf16 output is exactly the rounded fp32 one.
inline void rmsnorm_row(float* y, float& rstd, const float* x, const float* weight, int64_t C,
                        float inv_C, float eps) {
  float squares = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : squares)
  for (int64_t c = 0; c < C; ++c) squares += x[c] * x[c];
  const float s = 1.0f / std::sqrt(squares * inv_C + eps);
  // HF order: weight * (x * rsqrt(...)).
#pragma omp simd simdlen(16)
  for (int64_t c = 0; c < C; ++c) y[c] = weight[c] * (x[c] * s);
  rstd = s;
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t C, float eps) {
  check_shape("rmsnorm_forward", rows, C);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    rmsnorm_row(out + r * C, rstd[r], in + r * C, weight, C, inv_C, eps);
}

void rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in, const float* weight,
                          int64_t rows, int64_t C, float eps) {
  check_shape("rmsnorm_forward_bf16", rows, C);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));  // one fp32 row, in L1, rounded as it leaves
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      rmsnorm_row(row.data(), rstd[r], in + r * C, weight, C, inv_C, eps);
      convert_to_bf16_on_this_thread(out + r * C, row.data(), C);
    }
  }
}

void rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t C,
                      const float* residual_grad) {
  check_shape("rmsnorm_backward", rows, C);
  if (rows == 0) return;
  const RowChunks chunks = fixed_row_chunks(rows);
  std::vector<float> partials(static_cast<size_t>(chunks.count * C), 0.0f);
  const float inv_C = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks.count; ++chunk) {
    float* partial_weight = partials.data() + chunk * C;
    for (int64_t r = chunks.begin(chunk); r < chunks.end(chunk, rows); ++r) {
      const float* x = in + r * C;
      const float* dy = d_out + r * C;
      float* dx = d_in + r * C;
      const float s = rstd[r];
      float sum_dnorm_xhat = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sum_dnorm_xhat)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = x[c] * s;
        sum_dnorm_xhat += dy[c] * weight[c] * xhat;
        partial_weight[c] += dy[c] * xhat;
      }
      const float mean_dnorm_xhat = sum_dnorm_xhat * inv_C;
#pragma omp simd simdlen(16)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = x[c] * s;
        dx[c] = s * (dy[c] * weight[c] - xhat * mean_dnorm_xhat);
      }
      // The residual in a second loop over the row (in L1), not contracted into an FMA above.
      if (residual_grad != nullptr) {
        const float* dr = residual_grad + r * C;
#pragma omp simd simdlen(16)
        for (int64_t c = 0; c < C; ++c) dx[c] += dr[c];
      }
    }
  }
  add_chunk_partials(d_weight, partials.data(), chunks.count, C, C);
}

}  // namespace lattice::kernels
