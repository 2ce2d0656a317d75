// MatmulEngine: see matmul.hpp. This file: the engine's construction, the Linear forward and
// backward and the general GEMM (the other parts: matmul_engine.hpp).
// fp32 goes to oneDNN's row-major sgemm (gemm:jit), which takes transposes and leading dimensions
// directly: it matched or beat the fp32 brgemm matmul primitive on every backward product measured
// (2.7x faster for the backward of a [3072 -> 768] layer). The forward of a weight of up to 2^21
// elements runs on the primitive instead, in 512-row blocks with the bias in its epilogue (see
// forward), and the weight gradient in 512-row slices (weight_gradient_sgemm). bf16 is one oneDNN
// matmul primitive per product, dst[M,N] = alpha * A[M,K] · B[K,N] (+ bias)
// (+ beta * dst), on AMX (brg:avx512_core_amx_bf16) with fp32 accumulation and fp32 output.
// Operands are described by element strides, so the transposes the Linear layer needs (weight^T in
// forward, d_out^T in the weight gradient) cost no copy: brgemm reads the strided layouts directly.
// The fp32 operands are first rounded to bf16 (exactly lattice::to_bf16) into engine-owned buffers;
// accumulation into d_weight uses the sum post-op. Primitives are created once per shape, layout,
// scaling and thread count and kept, with their argument memories, in the engine. The row-chunk
// products (one thread per chunk) run on Lattice's own AMX kernel with the weight packed once per
// call where the shape fits its tiles (amx_packed_gemm.hpp): oneDNN's single-thread brgemm lays
// the whole weight out again on every chunk. The bf16 weight gradients (whole-batch and per row
// chunk) run on Lattice's AMX weight-gradient kernel where the shape fits its tiles
// (amx_weight_gradient.hpp): oneDNN reads d_out^T strided and ran them at 0.35-0.4 TFLOP/s per
// core in the training step. MatmulOptions::amx_kernels = false puts all of these back on oneDNN.
// Where oneDNN finds no AMX, its bf16 products would run on AVX512-BF16 dot products at half the
// fp32 rate; there the bf16 operands are widened to fp32 (exact) and multiplied by sgemm instead
// (Bf16FallbackGemm::widened_fp32), whole-batch and per row chunk alike.
#include "lattice/kernels/cpu/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"
#include "lattice/kernels/cpu/thread_columns.hpp"

namespace lattice::kernels {
namespace matmul_detail {

// d_bias[j] += sum_i d_out[i, j], summed in double row by row for each column, so the result does
// not depend on the thread count. When d_out16 is not null the same pass also writes d_out rounded
// to bf16 there (dense [M, N]), so the bf16 backward reads d_out from memory once. Each thread owns
// a contiguous range of columns and walks the rows (thread_columns): it streams through memory
// instead of revisiting every row's page once per narrow column block.
void accumulate_column_sums(float* d_bias, const float* d_out, int64_t M, int64_t N,
                            lattice::bf16* d_out16) {
#pragma omp parallel if (M * N > (1 << 15))
  {
    const ColumnRange range = thread_columns(N, omp_get_thread_num(), omp_get_num_threads());
    const int64_t width = range.width();
    if (width > 0) {
      std::vector<double> column_sums(static_cast<size_t>(width), 0.0);
      double* sums = column_sums.data();
      for (int64_t i = 0; i < M; ++i) {
        prefetch_next_row(d_out, i, M, N, range);
        const float* row = d_out + i * N + range.begin;
        if (d_out16 != nullptr)
          convert_to_bf16_on_this_thread(d_out16 + i * N + range.begin, row, width);
        for (int64_t j = 0; j < width; ++j) sums[j] += static_cast<double>(row[j]);
      }
      for (int64_t j = 0; j < width; ++j) d_bias[range.begin + j] += static_cast<float>(sums[j]);
    }
  }
}

// In slices of kWeightGradientRows rows added in order: oneDNN 2.6's sgemm ran the whole
// transposed reduction of a wide, shallow weight slower (on the AMX host, 2 threads: the small
// bench model's c_fc 2048 x 256 x 1024 at 224-303 GFLOP/s, 283-314 in 512-row slices; the other
// shapes of bench train's models even within 3%). The slicing depends on M alone, so a row slice
// of the weight (tensor parallelism) is summed in the same order. Where d_out's rows alias in the
// cache (transposed_weight_gradient), up to kTransposedGradientRows weight rows at a time as their
// transpose, in^T · d_out (d_out read along its rows), added to d_weight transposed: 135 -> 260
// GFLOP/s for the small model's LM head. That form depends on N, so a column slice of such a
// weight may take the other one: the same sums in another order (fp32 rounding).
void weight_gradient_sgemm(int64_t N, int64_t K, int64_t M, const float* d_out, const float* in,
                           float* d_weight, float* scratch) {
  if (!transposed_weight_gradient(N)) {
    for (int64_t first = 0; first < M; first += kWeightGradientRows)
      sgemm(true, false, N, K, std::min(kWeightGradientRows, M - first), 1.0f, d_out + first * N, N,
            in + first * K, K, 1.0f, d_weight, K);
    return;
  }
  const int64_t block_rows = transposed_gradient_rows(K);
  for (int64_t n0 = 0; n0 < N; n0 += block_rows) {
    const int64_t rows = std::min(block_rows, N - n0);
    // scratch[k, n] = sum over the M rows of in[m, k] · d_out[m, n0 + n]
    sgemm(true, false, K, rows, M, 1.0f, in, K, d_out + n0, N, 0.0f, scratch, rows);
    float* block = d_weight + n0 * K;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n += 16)
      for (int64_t k0 = 0; k0 < K; k0 += 16)
        for (int64_t i = n; i < std::min(n + 16, rows); ++i)
          for (int64_t k = k0; k < std::min(k0 + 16, K); ++k)
            block[i * K + k] += scratch[k * rows + i];
  }
}

}  // namespace matmul_detail

MatmulEngine::MatmulEngine(const MatmulOptions& options) : impl_(std::make_unique<Impl>(options)) {}

MatmulEngine::MatmulEngine(Bf16FallbackGemm bf16_fallback)
    : MatmulEngine([bf16_fallback] {
        MatmulOptions options = MatmulOptions::from_environment();
        if (bf16_fallback != Bf16FallbackGemm::automatic) options.bf16_fallback = bf16_fallback;
        return options;
      }()) {}
MatmulEngine::~MatmulEngine() = default;

int64_t MatmulEngine::scratch_bytes() const {
  size_t total = impl_->scratchpad.capacity();
  for (const auto& buffer : impl_->widened) total += buffer.capacity();
  for (const auto& buffer : impl_->bf16_operands) total += buffer.capacity();
  for (const auto& buffer : impl_->packed_weights) total += buffer.capacity();
  total += impl_->transposed_gradient.capacity();
  for (const auto& buffer : impl_->thread_chunks) total += buffer.capacity();
  for (const auto& buffer : impl_->thread_gradient_chunks) total += buffer.capacity();
  for (const auto& buffer : impl_->thread_scratchpads) total += buffer.capacity();
  for (const auto& buffer : impl_->thread_weight_gradient_scratch) total += buffer.capacity();
  return static_cast<int64_t>(total);
}

void MatmulEngine::forward(float* out, const float* in, const float* weight, const float* bias,
                           int64_t M, int64_t K, int64_t N, Precision precision,
                           const Bf16Operands& keep) {
  check_dims("forward", M, K, N);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no products: the bias alone, or zeros
    if (bias != nullptr) return broadcast_rows(out, bias, M, N);
    return std::fill(out, out + M * N, 0.0f);
  }
  // out[rows, N] = in[rows, K] · weight[N, K]^T (+ bias), weight read as its transpose [K, N].
  const auto linear_shape = [&](int64_t rows, bool use_bf16) {
    GemmShape s = Impl::shape(rows, N, K, use_bf16);
    s.a_stride_m = K, s.a_stride_k = 1;
    s.b_stride_k = 1, s.b_stride_n = K;
    s.ldc = N;
    s.has_bias = bias != nullptr;
    return s;
  };
  if (precision == Precision::fp32) {
    // Weights of up to kForwardPrimitiveWeight elements: blocks of kForwardPrimitiveRows rows
    // through oneDNN's matmul primitive, the bias in its epilogue. On the AMX host (2 threads) it
    // ran the small bench train shapes 5-17% faster than sgemm on rows pre-filled with the bias
    // (the LM head's 2048 x 256 x 8192: 330 GFLOP/s against 285), in 512-row blocks as fast as
    // whole; GPT-2 124M's 768 x 768 and 2304 x 768 weights even or 3% faster, its larger ones
    // (3072 x 768 both ways, the head's 50257 x 768) 4-6% slower, so they stay on sgemm. The fixed
    // block keeps one primitive per weight shape (a mixture of experts' row counts change every
    // step, and a primitive is built per shape); the last rows, fewer than a block, go to sgemm.
    // The backward's products stay on sgemm, as fast or faster there.
    int64_t first = 0;
    if (N * K <= kForwardPrimitiveWeight) {
      const GemmShape block = linear_shape(kForwardPrimitiveRows, /*use_bf16=*/false);
      for (; first + kForwardPrimitiveRows <= M; first += kForwardPrimitiveRows)
        impl_->run(block, in + first * K, weight, bias, out + first * N);
    }
    if (first == M) return;
    if (bias != nullptr) broadcast_rows(out + first * N, bias, M - first, N);
    return sgemm(false, true, M - first, N, K, 1.0f, in + first * K, K, weight, K,
                 bias != nullptr ? 1.0f : 0.0f, out + first * N, N);
  }
  const GemmShape s = linear_shape(M, /*use_bf16=*/true);
  const lattice::bf16* in16 = impl_->rounded_copy(keep.in, 0, in, M, K);
  const lattice::bf16* weight16 = impl_->rounded_weight({weight, keep.weight}, N, K);
  if (impl_->amx && amx_packed_gemm_fits(K, N) && M >= kDenseChunkRows) {
    // Lattice's AMX kernel on the weight packed once, rows in chunks over the threads.
    return multiply_in_row_chunks(
        in16, {weight, weight16}, /*weight_transposed=*/true, M, K, N, kDenseChunkRows,
        [](int64_t, int64_t, const float*) {}, bias, out);
  }
  impl_->run(s, in16, weight16, bias, out);
}

void MatmulEngine::backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                            const float* in, const float* weight, int64_t M, int64_t K, int64_t N,
                            Precision precision, const Bf16Operands& rounded) {
  check_dims("backward", M, K, N);
  const bool want_d_in = d_in != nullptr && M > 0 && K > 0;
  const bool want_d_weight = d_weight != nullptr && M > 0 && N > 0 && K > 0;
  const bool want_d_bias = d_bias != nullptr && M > 0 && N > 0;
  // bf16 with a GEMM to run: the bias sums come out of the pass that rounds d_out (below).
  const bool fuse_bias =
      want_d_bias && precision != Precision::fp32 && (want_d_in || want_d_weight);
  if (want_d_bias && !fuse_bias) accumulate_column_sums(d_bias, d_out, M, N);
  if (want_d_in && N == 0) {
    std::fill(d_in, d_in + M * K, 0.0f);
    return;
  }
  if (!want_d_in && !want_d_weight) return;
  if (precision == Precision::fp32) {
    if (want_d_in) sgemm(false, false, M, K, N, 1.0f, d_out, N, weight, K, 0.0f, d_in, K);
    if (want_d_weight)
      weight_gradient_sgemm(N, K, M, d_out, in, d_weight, impl_->transposed_gradient_scratch(N, K));
    return;
  }
  // bf16: d_out is rounded once (or was, by the caller) and read in both layouts.
  const lattice::bf16* d_out16 = rounded.d_out;
  if (d_out16 != nullptr) {
    if (fuse_bias) accumulate_column_sums(d_bias, d_out, M, N);
  } else if (fuse_bias) {
    auto* buffer = static_cast<lattice::bf16*>(
        impl_->bf16_operands[0].reserve(static_cast<size_t>(M * N) * sizeof(lattice::bf16)));
    accumulate_column_sums(d_bias, d_out, M, N, buffer);
    d_out16 = buffer;
  } else {
    d_out16 = impl_->to_bf16_buffer(0, d_out, M, N, N);
  }
  const bool amx_gradient = impl_->amx && amx_weight_gradient_fits(N, K);
  const bool amx_input = impl_->amx && amx_packed_gemm_fits(N, K) && M >= kDenseChunkRows;
  // Products off the AMX kernels where the engine widens bf16 operands: d_out16 widened once for
  // both (run_widened would widen it for each), then the sgemm calls run_widened makes, so the
  // same bits.
  const bool widened_gradient = want_d_weight && !amx_gradient && impl_->widen_bf16;
  const bool widened_input = want_d_in && !amx_input && impl_->widen_bf16;
  const float* d_out32 =
      widened_gradient || widened_input ? impl_->widen(0, d_out16, M * N) : nullptr;
  // The weight gradient first: its strided reads of d_out16 find the rows the rounding pass just
  // wrote still in cache; the input gradient streams through d_out16 after it.
  if (want_d_weight) {  // d_weight[N,K] += d_out^T[N,M] · in[M,K]
    const lattice::bf16* in16 = rounded.in ? rounded.in : impl_->to_bf16_buffer(2, in, M, K, K);
    if (amx_gradient) {
      impl_->amx_weight_gradient(d_weight, d_out16, in16, M, N, K, /*accumulate=*/true);
    } else if (widened_gradient) {
      weight_gradient_sgemm(N, K, M, d_out32, impl_->widen(1, in16, M * K), d_weight,
                            impl_->transposed_gradient_scratch(N, K));
    } else {  // d_out^T a strided view
      GemmShape s = Impl::shape(N, K, M, /*use_bf16=*/true);
      s.a_stride_m = 1, s.a_stride_k = N;
      s.b_stride_k = K, s.b_stride_n = 1;
      s.ldc = K;
      s.beta_bits = std::bit_cast<uint32_t>(1.0f);
      impl_->run(s, d_out16, in16, nullptr, d_weight);
    }
  }
  if (want_d_in) {  // d_in[M,K] = d_out[M,N] · weight[N,K]
    const lattice::bf16* weight16 = impl_->rounded_weight({weight, rounded.weight}, N, K);
    if (amx_input) {
      // As forward: d_in = d_out16 · weight on the AMX kernel, the weight packed as stored.
      return multiply_in_row_chunks(
          d_out16, {weight, weight16}, /*weight_transposed=*/false, M, N, K, kDenseChunkRows,
          [](int64_t, int64_t, const float*) {}, nullptr, d_in);
    }
    if (widened_input)
      return sgemm(false, false, M, K, N, 1.0f, d_out32, N, impl_->widen(1, weight16, N * K), K,
                   0.0f, d_in, K);
    GemmShape s = Impl::shape(M, K, N, /*use_bf16=*/true);
    s.a_stride_m = N, s.a_stride_k = 1;
    s.b_stride_k = K, s.b_stride_n = 1;
    s.ldc = K;
    impl_->run(s, d_out16, weight16, nullptr, d_in);
  }
}

void round_to_bf16_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out,
                                    int64_t M, int64_t N) {
  if (M <= 0 || N <= 0) return;
  if (d_bias == nullptr) return convert_to_bf16(d_out16, d_out, M * N);
  accumulate_column_sums(d_bias, d_out, M, N, d_out16);
}

void MatmulEngine::gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                        float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                        float beta, float* C, int64_t ldc, Precision precision) {
  check_dims("gemm", M, K, N);
  const int64_t a_cols = transpose_a ? M : K, a_rows = transpose_a ? K : M;
  const int64_t b_cols = transpose_b ? K : N, b_rows = transpose_b ? N : K;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) ||
      ldc < std::max<int64_t>(1, N))
    throw Error("gemm: leading dimension smaller than a row (lda=" + std::to_string(lda) +
                " needs >= " + std::to_string(a_cols) + ", ldb=" + std::to_string(ldb) +
                " needs >= " + std::to_string(b_cols) + ", ldc=" + std::to_string(ldc) +
                " needs >= " + std::to_string(N) + ")");
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) return scale_matrix(C, M, N, ldc, beta);
  if (precision == Precision::fp32)
    return sgemm(transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  GemmShape s = Impl::shape(M, N, K, /*use_bf16=*/true);
  s.alpha_bits = std::bit_cast<uint32_t>(alpha);
  s.beta_bits = std::bit_cast<uint32_t>(beta);
  s.ldc = ldc;
  // The bf16 copies are packed densely: each leading dimension becomes the row length.
  const lattice::bf16* a16 = impl_->to_bf16_buffer(0, A, a_rows, a_cols, lda);
  const lattice::bf16* b16 = impl_->to_bf16_buffer(1, B, b_rows, b_cols, ldb);
  if (transpose_a)
    s.a_stride_m = 1, s.a_stride_k = a_cols;
  else
    s.a_stride_m = a_cols, s.a_stride_k = 1;
  if (transpose_b)
    s.b_stride_k = 1, s.b_stride_n = b_cols;
  else
    s.b_stride_k = b_cols, s.b_stride_n = 1;
  impl_->run(s, a16, b16, nullptr, C);
}

}  // namespace lattice::kernels
