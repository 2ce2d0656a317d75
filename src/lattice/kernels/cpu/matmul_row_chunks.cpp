// MatmulEngine's row-chunk products (matmul.hpp): multiply_in_row_chunks (a product whose chunks
// are consumed while in cache) and forward_backward_in_row_chunks (a Linear's forward and backward
// in one pass), each chunk on one thread on Lattice's AMX kernels, oneDNN's single-thread GEMMs or
// sgemm on widened operands.
#include <omp.h>

#include <algorithm>
#include <optional>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {

void MatmulEngine::multiply_in_row_chunks(const lattice::bf16* in16, WeightOperand weight,
                                          bool weight_transposed, int64_t M, int64_t K, int64_t N,
                                          int64_t chunk_rows, const ChunkConsumer& consume,
                                          const float* bias, float* destination) {
  check_dims("multiply_in_row_chunks", M, K, N);
  check(chunk_rows > 0, "matmul multiply_in_row_chunks: chunk_rows must be positive");
  check(K > 0, "matmul multiply_in_row_chunks: K must be positive");
  if (M == 0 || N == 0) return;
  const RowChunks chunks = row_chunks_of(M, chunk_rows);
  // The weight rounded as forward() and backward() round it; the GEMMs read it in place.
  const lattice::bf16* weight16 =
      weight_transposed ? impl_->rounded_weight(weight, N, K) : impl_->rounded_weight(weight, K, N);
  // The AMX kernel on the weight packed once, where the shape fits it; else oneDNN's chunk GEMMs,
  // or sgemm on the weight widened once and each chunk's rows widened (Bf16FallbackGemm).
  const uint16_t* packed = nullptr;
  const float* weight32 = nullptr;
  std::optional<Impl::ChunkGemmPair> gemms;
  size_t scratch_bytes = 0;
  if (impl_->amx && amx_packed_gemm_fits(K, N)) {
    packed = impl_->packed_b(0, weight16, weight_transposed, K, N);
  } else if (impl_->widen_bf16) {
    weight32 = impl_->widen(1, weight16, K * N);
    scratch_bytes = static_cast<size_t>(chunks.rows_per_chunk * K) * sizeof(float);
  } else {
    // Shapes churn (e.g. varying batch tails): start over before the cache grows past its bound,
    // not between the lookups below.
    if (impl_->chunk_cache.size() + 2 > kMaxCachedPrimitives) impl_->chunk_cache.clear();
    gemms = impl_->chunk_gemms(weight_transposed, K, N, chunks, M);
    scratch_bytes = gemms->scratchpad_bytes();
  }
  const int threads = omp_get_max_threads();
  impl_->reserve_thread_buffers(
      threads,
      destination == nullptr ? static_cast<size_t>(chunks.rows_per_chunk * N) * sizeof(float) : 0,
      0, scratch_bytes);
  ChunkFailure failure;
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<size_t>(omp_get_thread_num());
    float* thread_chunk = static_cast<float*>(impl_->thread_chunks[t].reserve(0));
    void* scratch = scratch_bytes > 0 ? impl_->thread_scratchpads[t].reserve(0) : nullptr;
    std::optional<dnnl::stream> stream;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks.count; ++c) {
      failure.run([&] {
        if (!stream && gemms) stream.emplace(impl_->engine);  // oneDNN's chunks only
        const bool last = c + 1 == chunks.count;
        const int64_t row_begin = chunks.begin(c);
        const int64_t rows = chunks.end(c, M) - row_begin;
        if (weight32 != nullptr) {
          auto* in32 = static_cast<float*>(scratch);
          convert_to_f32_on_this_thread(in32, in16 + row_begin * K, rows * K);
          float* out = destination != nullptr ? destination + row_begin * N : thread_chunk;
          sgemm(false, weight_transposed, rows, N, K, 1.0f, in32, K, weight32,
                weight_transposed ? K : N, 0.0f, out, N);
          if (bias != nullptr) add_bias_rows(out, bias, rows, N);
          consume(row_begin, rows, out);
          return;
        }
        if (packed != nullptr) {
          // Passes whose output stays in L2, as in forward_backward_in_row_chunks.
          const int64_t pass_rows = destination != nullptr ? rows : amx_rows_per_pass(N);
          for (int64_t p0 = 0; p0 < rows; p0 += pass_rows) {
            const int64_t n = std::min(pass_rows, rows - p0);
            float* out = destination != nullptr ? destination + (row_begin + p0) * N : thread_chunk;
            amx_packed_gemm(out, N, in16 + (row_begin + p0) * K, K, packed, n, N, K);
            if (bias != nullptr) add_bias_rows(out, bias, n, N);
            consume(row_begin + p0, n, out);
          }
          return;
        }
        float* out = destination != nullptr ? destination + row_begin * N : thread_chunk;
        run_chunk_gemm(gemms->for_chunk(last), impl_->engine, *stream, in16 + row_begin * K,
                       weight16, out, scratch);
        if (bias != nullptr) add_bias_rows(out, bias, rows, N);
        consume(row_begin, rows, out);
      });
    }
  }
  failure.rethrow();
}

int MatmulEngine::gradient_lanes(int64_t M, int64_t chunk_rows) {
  if (M <= 0 || chunk_rows <= 0) return 1;
  return static_cast<int>(
      std::min<int64_t>(omp_get_max_threads(), row_chunks_of(M, chunk_rows).count));
}

void MatmulEngine::forward_backward_in_row_chunks(const lattice::bf16* in16, WeightOperand weight,
                                                  int64_t M, int64_t K, int64_t N,
                                                  int64_t chunk_rows,
                                                  const GradientChunkConsumer& consume, float* d_in,
                                                  float* weight_grad_partials, int lanes) {
  check_dims("forward_backward_in_row_chunks", M, K, N);
  check(chunk_rows > 0, "matmul forward_backward_in_row_chunks: chunk_rows must be positive");
  check(K > 0 && N > 0 && M > 0,
        "matmul forward_backward_in_row_chunks: M, K and N must be positive");
  check(lanes == gradient_lanes(M, chunk_rows),
        "matmul forward_backward_in_row_chunks: lanes must be gradient_lanes(M, chunk_rows) (" +
            std::to_string(gradient_lanes(M, chunk_rows)) + "), got " + std::to_string(lanes));
  const RowChunks chunks = row_chunks_of(M, chunk_rows);
  const lattice::bf16* weight16 = impl_->rounded_weight(weight, N, K);  // rounded once
  if (impl_->chunk_cache.size() + 8 > kMaxCachedPrimitives) impl_->chunk_cache.clear();
  // On AMX (K a multiple of 32; N any, padded to Np): out = in16 · weight^T and d_in = d_out16 ·
  // weight on the packed kernel with the weight packed once each way (zero-padded), the weight
  // gradient on the AMX weight-gradient kernel; out and d_out16 rows are Np apart, d_out16's
  // padding zero. Else all three on oneDNN's single-thread GEMMs, rows N apart.
  const bool amx = impl_->amx && K % 32 == 0;
  const int64_t stride = amx ? amx_padded(N) : N;
  const uint16_t* forward_packed = amx ? impl_->packed_b(0, weight16, true, K, N) : nullptr;
  const uint16_t* input_packed = amx ? impl_->packed_b(1, weight16, false, N, K) : nullptr;
  std::optional<Impl::ChunkGemmPair> forward_gemms, input_gemms;
  const ChunkGemm* gradient_gemms[2][2] = {};  // partial (+)= d_out16^T · in16 [accumulate][last]
  size_t scratch_bytes = 0;
  // Without AMX, where the engine widens bf16 operands: the weight widened once; each chunk's
  // input rows and d_out16 widened into the thread's scratch ([rows, K] then [rows, N]).
  const float* weight32 = !amx && impl_->widen_bf16 ? impl_->widen(1, weight16, N * K) : nullptr;
  if (amx) {
    scratch_bytes = amx_weight_gradient_scratch_bytes(chunks.rows_per_chunk, N, K,
                                                      WeightGradientUpdate::accumulate);
  } else if (weight32 != nullptr) {
    scratch_bytes = static_cast<size_t>(chunks.rows_per_chunk * (K + N)) * sizeof(float);
  } else {
    forward_gemms = impl_->chunk_gemms(/*b_transposed=*/true, K, N, chunks, M);
    input_gemms = impl_->chunk_gemms(/*b_transposed=*/false, N, K, chunks, M);
    scratch_bytes = std::max(forward_gemms->scratchpad_bytes(), input_gemms->scratchpad_bytes());
    for (int accumulate = 0; accumulate < 2; ++accumulate) {
      const ChunkGemmKind kind =
          accumulate ? ChunkGemmKind::weight_gradient_accumulate : ChunkGemmKind::weight_gradient;
      for (int last = 0; last < 2; ++last) {
        const int64_t rows = last ? tail_rows(chunks, M) : chunks.rows_per_chunk;
        gradient_gemms[accumulate][last] = &impl_->chunk_primitive_for(N, K, rows, kind);
        scratch_bytes = std::max(scratch_bytes, gradient_gemms[accumulate][last]->scratchpad_bytes);
      }
    }
  }
  const auto chunk_elements = static_cast<size_t>(chunks.rows_per_chunk * stride);
  impl_->reserve_thread_buffers(lanes, chunk_elements * sizeof(float),
                                chunk_elements * sizeof(lattice::bf16), scratch_bytes);
  ChunkFailure failure;
#pragma omp parallel num_threads(lanes)
  {
    // Lane l takes the chunks [l·chunks/lanes, (l+1)·chunks/lanes) in order (at least one: lanes
    // never exceed chunks), so its partial's sum order is fixed by `lanes` alone; a thread runs
    // more than one lane only if the runtime gave the region fewer threads than asked.
    const auto t = static_cast<size_t>(omp_get_thread_num());
    float* out = static_cast<float*>(impl_->thread_chunks[t].reserve(0));
    auto* d_out16 = static_cast<lattice::bf16*>(impl_->thread_gradient_chunks[t].reserve(0));
    void* scratch = scratch_bytes > 0 ? impl_->thread_scratchpads[t].reserve(0) : nullptr;
    std::optional<dnnl::stream> stream;
    for (int lane = omp_get_thread_num(); lane < lanes; lane += omp_get_num_threads()) {
      const int64_t first = lane * chunks.count / lanes, stop = (lane + 1) * chunks.count / lanes;
      float* partial = weight_grad_partials + static_cast<int64_t>(lane) * N * K;
      for (int64_t c = first; c < stop; ++c) {
        failure.run([&] {
          const bool last = c + 1 == chunks.count;
          const int64_t row_begin = chunks.begin(c);
          const int64_t rows = chunks.end(c, M) - row_begin;
          const lattice::bf16* in_rows = in16 + row_begin * K;
          if (amx) {
            // In passes whose fp32 output stays in L2 for the consumer where a pass of 32 rows
            // fits there (an output as wide as GPT-2's vocabulary goes through memory anyway: its
            // chunk runs whole, reading the packed weight once).
            const int64_t pass_rows = amx_rows_per_pass(stride);
            for (int64_t p0 = 0; p0 < rows; p0 += pass_rows) {
              const int64_t n = std::min(pass_rows, rows - p0);
              amx_packed_gemm(out, stride, in_rows + p0 * K, K, forward_packed, n, N, K);
              consume(row_begin + p0, n, out, d_out16 + p0 * stride, stride);
            }
            if (stride != N)  // the input gradient sums over d_out16's padding too
              for (int64_t r = 0; r < rows; ++r)
                std::fill(d_out16 + r * stride + N, d_out16 + (r + 1) * stride, lattice::bf16{0});
            amx_packed_gemm(d_in + row_begin * K, K, d_out16, stride, input_packed, rows, K, N);
            amx_weight_gradient_block(
                partial, K, d_out16, stride, in_rows, K, rows, N, K,
                c == first ? WeightGradientUpdate::overwrite : WeightGradientUpdate::accumulate,
                scratch);
            return;
          }
          if (weight32 != nullptr) {
            auto* in32 = static_cast<float*>(scratch);
            float* d_out32 = in32 + chunks.rows_per_chunk * K;
            convert_to_f32_on_this_thread(in32, in_rows, rows * K);
            sgemm(false, true, rows, N, K, 1.0f, in32, K, weight32, K, 0.0f, out, N);
            consume(row_begin, rows, out, d_out16, N);
            convert_to_f32_on_this_thread(d_out32, d_out16, rows * N);
            sgemm(false, false, rows, K, N, 1.0f, d_out32, N, weight32, K, 0.0f,
                  d_in + row_begin * K, K);
            sgemm(true, false, N, K, rows, 1.0f, d_out32, N, in32, K, c == first ? 0.0f : 1.0f,
                  partial, K);
            return;
          }
          if (!stream) stream.emplace(impl_->engine);
          run_chunk_gemm(forward_gemms->for_chunk(last), impl_->engine, *stream, in_rows, weight16,
                         out, scratch);
          consume(row_begin, rows, out, d_out16, N);
          run_chunk_gemm(input_gemms->for_chunk(last), impl_->engine, *stream, d_out16, weight16,
                         d_in + row_begin * K, scratch);
          run_chunk_gemm(*gradient_gemms[c == first ? 0 : 1][last ? 1 : 0], impl_->engine, *stream,
                         d_out16, in_rows, partial, scratch);
        });
      }
    }
  }
  failure.rethrow();
}

}  // namespace lattice::kernels
