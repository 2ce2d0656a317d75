// MatmulEngine's private parts, shared by its files (private to kernels/cpu): the GEMM shapes and
// oneDNN primitives it caches, its scratch buffers, the row-chunk helpers and MatmulEngine::Impl.
// matmul.cpp holds forward / backward / gemm, matmul_primitives.cpp the primitive cache,
// matmul_bf16_fallback.cpp the choice of where bf16 products run, matmul_row_chunks.cpp the
// row-chunk products and matmul_fused_head.cpp the vocabulary-blocked head.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {
namespace matmul_detail {

// One GEMM as handed to oneDNN. A is M x K with element strides (a_stride_m, a_stride_k), B is K x
// N with strides (b_stride_k, b_stride_n), C is M x N with row stride ldc.
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  int64_t a_stride_m = 0, a_stride_k = 0;
  int64_t b_stride_k = 0, b_stride_n = 0;
  int64_t ldc = 0;
  bool use_bf16 = false;
  bool has_bias = false;
  uint32_t alpha_bits = 0, beta_bits = 0;
  int threads = 1;  // oneDNN fixes its work split when a primitive is created

  float alpha() const { return std::bit_cast<float>(alpha_bits); }
  float beta() const { return std::bit_cast<float>(beta_bits); }
  bool operator==(const GemmShape&) const = default;
};

struct GemmShapeHash {
  size_t operator()(const GemmShape& s) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (int64_t v : {s.M, s.N, s.K, s.a_stride_m, s.a_stride_k, s.b_stride_k, s.b_stride_n, s.ldc})
      mix(static_cast<uint64_t>(v));
    mix((static_cast<uint64_t>(s.alpha_bits) << 32) | s.beta_bits);
    mix((static_cast<uint64_t>(s.threads) << 2) | (s.use_bf16 ? 2u : 0u) | (s.has_bias ? 1u : 0u));
    return h;
  }
};

// A primitive with its argument memories: only their data pointers change from call to call.
struct CachedGemm {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
  size_t scratchpad_bytes = 0;
};

// A grow-only, 64-byte-aligned byte buffer (huge pages when large: aligned_allocation.hpp).
class AlignedBuffer {
 public:
  void* reserve(size_t bytes) {
    if (bytes > capacity_) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      void* fresh = allocate_aligned(rounded);
      if (fresh == nullptr)
        throw Error("matmul: out of memory allocating " + std::to_string(rounded) +
                    " bytes of scratch");
      data_.reset(fresh);
      capacity_ = rounded;
    }
    return data_.get();
  }
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(void* p) const { free_aligned(p); }
  };
  std::unique_ptr<void, Free> data_;
  size_t capacity_ = 0;
};

// Beyond this many cached primitives (shapes churn, e.g. attention over varying lengths) start
// over.
inline constexpr size_t kMaxCachedPrimitives = 512;

inline void check_dims(const char* what, int64_t M, int64_t K, int64_t N) {
  if (M < 0 || K < 0 || N < 0)
    throw Error(std::string("matmul ") + what + ": negative size (M=" + std::to_string(M) +
                ", K=" + std::to_string(K) + ", N=" + std::to_string(N) + ")");
}

// C[M,N] (row stride ldc) = beta * C, without reading C when beta is 0.
inline void scale_matrix(float* C, int64_t M, int64_t N, int64_t ldc, float beta) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

// fp32 C = alpha * op(A) · op(B) + beta * C through oneDNN's row-major sgemm (C is not read when
// beta is 0).
inline void sgemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', M, N, K,
                                          alpha, A, lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success)
    throw Error("matmul: oneDNN sgemm failed (status " + std::to_string(status) + ") for M=" +
                std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
}

// Rows of the reduction per weight_gradient_sgemm product; in its transposed form, weight rows per
// product, fewer where the scratch (K floats a row) would pass kTransposedGradientScratchFloats.
inline constexpr int64_t kWeightGradientRows = 512;
inline constexpr int64_t kTransposedGradientRows = 1024;
inline constexpr int64_t kTransposedGradientScratchFloats = int64_t{1} << 21;  // 8 MiB

// Whether weight_gradient_sgemm takes its transposed form: d_out's rows (N floats) a multiple of
// 16 KiB apart. oneDNN's sgemm reads d_out^T down such rows a few cache sets at a time: on 2 MiB
// pages (Lattice's large tensors) the LM head of bench train's small model (2048 x 256 x 8192,
// rows 32 KiB apart) ran at 135 GFLOP/s against 260-310 for every other shape measured.
inline bool transposed_weight_gradient(int64_t N) {
  return N % 4096 == 0;
}

// Weight rows per product of weight_gradient_sgemm's transposed form (a multiple of 16).
inline int64_t transposed_gradient_rows(int64_t K) {
  return std::clamp<int64_t>(kTransposedGradientScratchFloats / std::max<int64_t>(K, 1) / 16 * 16,
                             16, kTransposedGradientRows);
}

// The scratch weight_gradient_sgemm needs (floats).
inline int64_t weight_gradient_scratch_floats(int64_t N, int64_t K) {
  return transposed_weight_gradient(N) ? K * transposed_gradient_rows(K) : 0;
}

// d_weight[N,K] += d_out^T · in over M rows (d_out [M,N], in [M,K], both row-major) with `scratch`
// of weight_gradient_scratch_floats(N, K) (matmul.cpp).
void weight_gradient_sgemm(int64_t N, int64_t K, int64_t M, const float* d_out, const float* in,
                           float* d_weight, float* scratch);

// Rows per oneDNN matmul primitive in an fp32 Linear forward, and the largest weight (elements)
// it runs there (MatmulEngine::forward).
inline constexpr int64_t kForwardPrimitiveRows = 512;
inline constexpr int64_t kForwardPrimitiveWeight = int64_t{1} << 21;

// Every row of out[M,N] set to bias[N].
inline void broadcast_rows(float* out, const float* bias, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N > (1 << 16))
  for (int64_t i = 0; i < M; ++i)
    std::memcpy(out + i * N, bias, static_cast<size_t>(N) * sizeof(float));
}

// A bf16 GEMM of one row chunk that runs on the calling thread inside a parallel region.
struct ChunkGemm {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
};

// What a ChunkGemm computes for a chunk of `rows` rows:
//   weight / weight_transposed: C[rows, N] = A[rows, K] · B[K, N], A and C dense, B read in place
//                   from the bf16 weight, [K, N] row-major or (transposed) [N, K] row-major;
//   weight_gradient(_accumulate): C[rows, N] (+)= A^T · B with A stored [K, rows] (a chunk of
//                   d_out, read transposed) and B[K, N] dense (the chunk's input rows): one
//                   chunk's contribution to a weight gradient, here `rows` is the weight's N.
// B is read in its plain layout: oneDNN 2.6's single-thread brgemm ran these shapes about twice as
// fast from a plain B (which it copies in blocks) as from B reordered once into the layout it
// proposes for format_tag::any (measured: 256x256x1024 0.64 vs 0.32 TFLOP/s, 256x256x8192 0.43
// vs 0.28).
enum class ChunkGemmKind : int64_t {
  weight,
  weight_transposed,
  weight_gradient,
  weight_gradient_accumulate
};

// Runs a chunk GEMM on the calling thread with `scratch` as its scratchpad.
inline void run_chunk_gemm(const ChunkGemm& g, const dnnl::engine& engine, dnnl::stream& stream,
                           const void* A, const void* B, float* C, void* scratch) {
  dnnl::memory a(g.pd.src_desc(), engine, const_cast<void*>(A));
  dnnl::memory b(g.pd.weights_desc(), engine, const_cast<void*>(B));
  dnnl::memory c(g.pd.dst_desc(), engine, C);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (g.scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(g.pd.scratchpad_desc(), engine, scratch));
  g.primitive.execute(stream, args);
  stream.wait();
}

// out[rows, N] += bias[N] on every row.
inline void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t N) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * N;
#pragma omp simd simdlen(16)
    for (int64_t j = 0; j < N; ++j) row[j] += bias[j];
  }
}

// Runs body(chunk) for each chunk of a parallel region's loop, keeping the first exception (an
// exception may not leave a parallel region or skip its loop's barrier) and skipping the chunks
// after it; the caller rethrows it after the region.
class ChunkFailure {
 public:
  template <typename Body>
  void run(Body&& body) {
    bool skip;
#pragma omp atomic read
    skip = failed_;
    if (skip) return;
    try {
      body();
    } catch (...) {
#pragma omp critical(lattice_matmul_chunk_failure)
      if (!failure_) failure_ = std::current_exception();
#pragma omp atomic write
      failed_ = true;
    }
  }
  void rethrow() const {
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  std::exception_ptr failure_;
  bool failed_ = false;
};

// Rows per chunk when forward() and backward() run a whole product on the AMX kernel: enough to
// amortise a chunk's start, and several chunks per thread at the models' token counts.
inline constexpr int64_t kDenseChunkRows = 256;

// Rows of an AMX chunk GEMM pass: a multiple of 32 whose fp32 output [rows, N] fits in 2 MiB (L2);
// all of them (the largest int64_t) when not even 32 rows fit: each pass reads the whole packed
// weight, which for so wide an output is far larger than the output a pass saves from memory.
inline int64_t amx_rows_per_pass(int64_t N) {
  constexpr int64_t kOutputBytes = int64_t{2} << 20;
  const int64_t rows = kOutputBytes / (N * 4) / 32 * 32;
  return rows >= 32 ? rows : std::numeric_limits<int64_t>::max();
}

// Rows in the last of `chunks` over M rows.
inline int64_t tail_rows(const RowChunks& chunks, int64_t M) {
  return chunks.end(chunks.count - 1, M) - chunks.begin(chunks.count - 1);
}

// d_bias[j] += the column sums of d_out[M, N] in double, optionally rounding d_out into d_out16 in
// the same pass (matmul.cpp).
void accumulate_column_sums(float* d_bias, const float* d_out, int64_t M, int64_t N,
                            lattice::bf16* d_out16 = nullptr);

// Where bf16 products run (matmul_bf16_fallback.cpp): whether oneDNN's bf16 GEMMs run on AMX here,
// whether oneDNN builds bf16 GEMMs at all, and an engine's fallback (never automatic).
bool onednn_has_amx();
bool onednn_builds_bf16_gemms();
Bf16FallbackGemm resolve_bf16_fallback(Bf16FallbackGemm requested);

}  // namespace matmul_detail

using namespace matmul_detail;  // NOLINT(google-build-using-namespace): the engine's own parts

struct MatmulEngine::Impl {
  explicit Impl(const MatmulOptions& options)
      : widen_bf16(resolve_bf16_fallback(options.bf16_fallback) == Bf16FallbackGemm::widened_fp32),
        amx(options.amx_kernels && amx_packed_gemm_enabled()) {}

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // bf16 products off the AMX kernels on widened fp32 operands and sgemm (Bf16FallbackGemm).
  const bool widen_bf16;
  // Lattice's AMX kernels take the products they fit (MatmulOptions::amx_kernels, and AMX here).
  const bool amx;
  // fp32 widenings of up to two bf16 operands of one call (A / B, or a row-chunk call's weight).
  std::array<AlignedBuffer, 2> widened;
  std::unordered_map<GemmShape, CachedGemm, GemmShapeHash> cache;
  AlignedBuffer scratchpad;
  // bf16 copies of up to three fp32 operands of one call (in / weight / d_out, or A / B).
  std::array<AlignedBuffer, 3> bf16_operands;
  // A row-chunk call's weight packed for the AMX kernel (amx_packed_gemm.hpp): [0] as the forward
  // reads it (weight^T), [1] as the input gradient does.
  std::array<AlignedBuffer, 2> packed_weights;
  // weight_gradient_sgemm's transposed products.
  AlignedBuffer transposed_gradient;
  // Row-chunk GEMMs: single-thread primitives keyed by (rows, N, K, kind) (references stay valid
  // until the map is cleared) and each thread's output chunk, gradient chunk and scratchpad.
  std::map<std::array<int64_t, 4>, ChunkGemm> chunk_cache;
  std::vector<AlignedBuffer> thread_chunks, thread_gradient_chunks, thread_scratchpads;
  // Each thread's scratch for the AMX weight gradient (amx_weight_gradient.hpp).
  std::vector<AlignedBuffer> thread_weight_gradient_scratch;

  // weight_gradient_sgemm's scratch for an [N, K] weight (null where it needs none).
  float* transposed_gradient_scratch(int64_t N, int64_t K) {
    const int64_t floats = weight_gradient_scratch_floats(N, K);
    if (floats == 0) return nullptr;
    return static_cast<float*>(
        transposed_gradient.reserve(static_cast<size_t>(floats) * sizeof(float)));
  }

  // The chunk and tail GEMMs of C[M, N] = A[M, K] · B[K, N] over chunks of `chunk_rows` rows, B
  // (bf16) [N, K] row-major when b_transposed, else [K, N].
  struct ChunkGemmPair {
    const ChunkGemm* gemm[2];  // [0]: full chunks, [1]: the last chunk
    const ChunkGemm& for_chunk(bool last) const { return *gemm[last ? 1 : 0]; }
    size_t scratchpad_bytes() const {
      return std::max(gemm[0]->scratchpad_bytes, gemm[1]->scratchpad_bytes);
    }
  };
  ChunkGemmPair chunk_gemms(bool b_transposed, int64_t K, int64_t N, const RowChunks& chunks,
                            int64_t M) {
    const ChunkGemmKind kind =
        b_transposed ? ChunkGemmKind::weight_transposed : ChunkGemmKind::weight;
    return {{&chunk_primitive_for(chunks.rows_per_chunk, N, K, kind),
             &chunk_primitive_for(tail_rows(chunks, M), N, K, kind)}};
  }

  // Each of `threads` threads' buffers: `chunk_bytes` of output (when non-zero), `gradient_bytes`
  // of gradient chunk (when non-zero) and `scratch_bytes` of scratchpad.
  void reserve_thread_buffers(int threads, size_t chunk_bytes, size_t gradient_bytes,
                              size_t scratch_bytes) {
    thread_chunks.resize(static_cast<size_t>(threads));
    thread_gradient_chunks.resize(static_cast<size_t>(threads));
    thread_scratchpads.resize(static_cast<size_t>(threads));
    for (size_t t = 0; t < static_cast<size_t>(threads); ++t) {
      if (chunk_bytes > 0) thread_chunks[t].reserve(chunk_bytes);
      if (gradient_bytes > 0) thread_gradient_chunks[t].reserve(gradient_bytes);
      if (scratch_bytes > 0) thread_scratchpads[t].reserve(scratch_bytes);
    }
  }

  bf16* to_bf16_buffer(int slot, const float* src, int64_t rows, int64_t cols, int64_t row_stride) {
    auto* dst = static_cast<bf16*>(bf16_operands[static_cast<size_t>(slot)].reserve(
        static_cast<size_t>(rows * cols) * sizeof(bf16)));
    convert_rows_to_bf16(dst, src, rows, cols, row_stride);
    return dst;
  }

  // weight16 packed for amx_packed_gemm into packed_weights[slot]: B = weight16^T ([N, K] given)
  // when weight_transposed, else B = weight16 ([K, N] given).
  const uint16_t* packed_b(int slot, const bf16* weight16, bool weight_transposed, int64_t K,
                           int64_t N) {
    auto* packed = static_cast<uint16_t*>(packed_weights[static_cast<size_t>(slot)].reserve(
        static_cast<size_t>(amx_padded(K) * amx_padded(N)) * sizeof(uint16_t)));
    pack_b_panels(packed, weight16, weight_transposed, K, N);
    return packed;
  }

  // `src` [rows, cols] rounded to bf16 into `keep` when given (caller-owned), else into `slot`;
  // with `keep` and no `src`, `keep` already holds the rounded values.
  bf16* rounded_copy(bf16* keep, int slot, const float* src, int64_t rows, int64_t cols) {
    if (keep == nullptr) return to_bf16_buffer(slot, src, rows, cols, cols);
    if (src != nullptr) convert_to_bf16(keep, src, rows * cols);
    return keep;
  }

  // The weight [rows, cols] in bf16: the caller's rounded copy when it has one, else its fp32
  // values rounded into slot 1.
  const bf16* rounded_weight(const WeightOperand& weight, int64_t rows, int64_t cols) {
    return weight.rounded != nullptr ? weight.rounded
                                     : to_bf16_buffer(1, weight.f32, rows, cols, cols);
  }

  // `elements` bf16 values widened to fp32 into widened[slot] (threaded).
  const float* widen(int slot, const bf16* src, int64_t elements) {
    auto* dst = static_cast<float*>(
        widened[static_cast<size_t>(slot)].reserve(static_cast<size_t>(elements) * sizeof(float)));
    convert_to_f32(dst, src, elements);
    return dst;
  }

  // d_weight[N, K] (+)= d_out16^T · in16 on the AMX weight-gradient kernel (matmul_primitives.cpp).
  void amx_weight_gradient(float* d_weight, const bf16* d_out16, const bf16* in16, int64_t M,
                           int64_t N, int64_t K, bool accumulate);
  // The single-thread bf16 primitive of a row-chunk GEMM, created once (matmul_primitives.cpp).
  ChunkGemm& chunk_primitive_for(int64_t rows, int64_t N, int64_t K, ChunkGemmKind kind);
  // The cached primitive of a whole-batch GEMM, created once (matmul_primitives.cpp).
  CachedGemm& primitive_for(const GemmShape& s);
  // run() for a bf16 shape on widened operands (matmul_primitives.cpp).
  void run_widened(const GemmShape& s, const void* A, const void* B, const float* bias, float* C);
  // Runs C = alpha * A · B (+ bias) (+ beta * C) for the given shape; sizes must be positive.
  void run(const GemmShape& s, const void* A, const void* B, const float* bias, float* C);

  static GemmShape shape(int64_t M, int64_t N, int64_t K, bool use_bf16) {
    GemmShape s;
    s.M = M;
    s.N = N;
    s.K = K;
    s.use_bf16 = use_bf16;
    s.alpha_bits = std::bit_cast<uint32_t>(1.0f);
    s.beta_bits = std::bit_cast<uint32_t>(0.0f);
    s.threads = omp_get_max_threads();
    return s;
  }
};

}  // namespace lattice::kernels
