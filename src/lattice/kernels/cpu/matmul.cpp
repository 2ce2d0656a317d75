// MatmulEngine: see matmul.hpp.
// fp32 goes to oneDNN's row-major sgemm (gemm:jit), which takes transposes and leading dimensions
// directly; on this machine it matched or beat the fp32 brgemm matmul primitive on every Linear
// shape measured and was 2.7x faster for the backward of a [3072 -> 768] layer. bf16 is one oneDNN
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
#include "lattice/kernels/cpu/amx_vocab_blocked_head.hpp"
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"
#include "lattice/kernels/cpu/scoped_omp_threads.hpp"
#include "lattice/kernels/cpu/thread_columns.hpp"

namespace lattice::kernels {
namespace {

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
constexpr size_t kMaxCachedPrimitives = 512;

void check_dims(const char* what, int64_t M, int64_t K, int64_t N) {
  if (M < 0 || K < 0 || N < 0)
    throw Error(std::string("matmul ") + what + ": negative size (M=" + std::to_string(M) +
                ", K=" + std::to_string(K) + ", N=" + std::to_string(N) + ")");
}

// d_bias[j] += sum_i d_out[i, j], summed in double row by row for each column, so the result does
// not depend on the thread count. When d_out16 is not null the same pass also writes d_out rounded
// to bf16 there (dense [M, N]), so the bf16 backward reads d_out from memory once. Each thread owns
// a contiguous range of columns and walks the rows (thread_columns): it streams through memory
// instead of revisiting every row's page once per narrow column block.
void accumulate_column_sums(float* d_bias, const float* d_out, int64_t M, int64_t N,
                            lattice::bf16* d_out16 = nullptr) {
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

// C[M,N] (row stride ldc) = beta * C, without reading C when beta is 0.
void scale_matrix(float* C, int64_t M, int64_t N, int64_t ldc, float beta) {
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
void sgemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', M, N, K,
                                          alpha, A, lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success)
    throw Error("matmul: oneDNN sgemm failed (status " + std::to_string(status) + ") for M=" +
                std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
}

// Every row of out[M,N] set to bias[N].
void broadcast_rows(float* out, const float* bias, int64_t M, int64_t N) {
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
void run_chunk_gemm(const ChunkGemm& g, const dnnl::engine& engine, dnnl::stream& stream,
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
void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t N) {
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
constexpr int64_t kDenseChunkRows = 256;

// Rows of an AMX chunk GEMM pass: a multiple of 32 whose fp32 output [rows, N] fits in 2 MiB (L2);
// all of them (the largest int64_t) when not even 32 rows fit: each pass reads the whole packed
// weight, which for so wide an output is far larger than the output a pass saves from memory.
int64_t amx_rows_per_pass(int64_t N) {
  constexpr int64_t kOutputBytes = int64_t{2} << 20;
  const int64_t rows = kOutputBytes / (N * 4) / 32 * 32;
  return rows >= 32 ? rows : std::numeric_limits<int64_t>::max();
}

// Whether oneDNN's bf16 GEMMs run on AMX here: its effective ISA (a bit mask that contains the
// lower ISAs) includes avx512_core_amx.
bool onednn_has_amx() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;
}

// Whether oneDNN builds bf16 matmul primitives on this CPU at all: oneDNN 2.6 has them from
// AVX-512 (avx512_core) up and none below, so on an AVX2-only CPU (AMD Zen 3), or under
// ONEDNN_MAX_CPU_ISA=AVX2, creating one fails ("could not create a primitive descriptor
// iterator"). Probed once on a small shape; oneDNN fixes its ISA at first use, so the answer holds
// for the process.
bool onednn_builds_bf16_gemms() {
  static const bool builds = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using dt = dnnl::memory::data_type;
      const dnnl::memory::desc a({32, 32}, dt::bf16, {32, 1}), b({32, 32}, dt::bf16, {32, 1});
      const dnnl::memory::desc c({32, 32}, dt::f32, {32, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return builds;
}

// A request for oneDNN's bf16 matmul, refused with the fix where oneDNN has none.
Bf16FallbackGemm checked_bf16_fallback(Bf16FallbackGemm chosen, const std::string& source) {
  if (chosen == Bf16FallbackGemm::onednn_bf16 && !onednn_builds_bf16_gemms())
    throw Error("matmul: " + source +
                " asks for oneDNN's bf16 matmul, which oneDNN builds only on CPUs with AVX-512 "
                "(not on this one, or not under this ONEDNN_MAX_CPU_ISA): use the widened fp32 "
                "fallback (LATTICE_MATMUL_BF16_FALLBACK=fp32, Bf16FallbackGemm::widened_fp32) "
                "or the automatic choice");
  return chosen;
}

// The engine's bf16 fallback: the requested one, or for automatic oneDNN's bf16 matmul where
// oneDNN has AMX (oneDNN's AMX implies its bf16 primitives; checked anyway, so automatic never
// picks a path that cannot run) and the widened fp32 one elsewhere.
Bf16FallbackGemm resolve_bf16_fallback(Bf16FallbackGemm requested) {
  if (requested != Bf16FallbackGemm::automatic)
    return checked_bf16_fallback(requested, "Bf16FallbackGemm::onednn_bf16");
  return onednn_has_amx() && onednn_builds_bf16_gemms() ? Bf16FallbackGemm::onednn_bf16
                                                        : Bf16FallbackGemm::widened_fp32;
}

// Rows in the last of `chunks` over M rows.
int64_t tail_rows(const RowChunks& chunks, int64_t M) {
  return chunks.end(chunks.count - 1, M) - chunks.begin(chunks.count - 1);
}

}  // namespace

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
  // Row-chunk GEMMs: single-thread primitives keyed by (rows, N, K, kind) (references stay valid
  // until the map is cleared) and each thread's output chunk, gradient chunk and scratchpad.
  std::map<std::array<int64_t, 4>, ChunkGemm> chunk_cache;
  std::vector<AlignedBuffer> thread_chunks, thread_gradient_chunks, thread_scratchpads;
  // Each thread's scratch for the AMX weight gradient (amx_weight_gradient.hpp).
  std::vector<AlignedBuffer> thread_weight_gradient_scratch;

  // d_weight[N, K] (+)= d_out16^T · in16 on the AMX weight-gradient kernel: the threads split the
  // longer of d_weight's two sides in 32-wide blocks (each thread then packs the whole of the
  // operand along the other side, the smaller), every thread sweeping all M rows.
  void amx_weight_gradient(float* d_weight, const bf16* d_out16, const bf16* in16, int64_t M,
                           int64_t N, int64_t K, bool accumulate) {
    const int threads = omp_get_max_threads();
    const WeightGradientUpdate update =
        accumulate ? WeightGradientUpdate::add : WeightGradientUpdate::overwrite;
    const bool split_rows = N >= K;
    const int64_t blocks = (split_rows ? N : K) / 32;
    const auto range = [&](int t) {
      return std::pair<int64_t, int64_t>{blocks * t / threads * 32,
                                         blocks * (t + 1) / threads * 32};
    };
    thread_weight_gradient_scratch.resize(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      const auto [begin, end] = range(t);
      if (end > begin)
        thread_weight_gradient_scratch[static_cast<size_t>(t)].reserve(
            split_rows
                ? amx_weight_gradient_scratch_bytes(M, end - begin, K, WeightGradientUpdate::add)
                : amx_weight_gradient_scratch_bytes(M, N, end - begin, WeightGradientUpdate::add));
    }
    ChunkFailure failure;
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      const auto [begin, end] = range(t);
      void* scratch = thread_weight_gradient_scratch[static_cast<size_t>(t)].reserve(0);
      if (end > begin) {
        failure.run([&] {
          if (split_rows)
            amx_weight_gradient_block(d_weight + begin * K, K, d_out16 + begin, N, in16, K, M,
                                      end - begin, K, update, scratch);
          else
            amx_weight_gradient_block(d_weight + begin, K, d_out16, N, in16 + begin, K, M, N,
                                      end - begin, update, scratch);
        });
      }
    }
    failure.rethrow();
  }

  ChunkGemm& chunk_primitive_for(int64_t rows, int64_t N, int64_t K, ChunkGemmKind kind) {
    const std::array<int64_t, 4> key{rows, N, K, static_cast<int64_t>(kind)};
    auto found = chunk_cache.find(key);
    if (found != chunk_cache.end()) return found->second;
    using dt = dnnl::memory::data_type;
    const bool gradient =
        kind == ChunkGemmKind::weight_gradient || kind == ChunkGemmKind::weight_gradient_accumulate;
    const dnnl::memory::desc a_md(
        {rows, K}, dt::bf16, gradient ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{K, 1});
    const dnnl::memory::desc b_md({K, N}, dt::bf16,
                                  kind == ChunkGemmKind::weight_transposed
                                      ? dnnl::memory::dims{1, K}
                                      : dnnl::memory::dims{N, 1});
    const dnnl::memory::desc c_md({rows, N}, dt::f32, {N, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (kind == ChunkGemmKind::weight_gradient_accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    ChunkGemm g;
    try {
      // oneDNN fixes a primitive's work split when it is created: build it for the one thread
      // that runs it.
      const ScopedOmpThreads one_thread(1);
      g.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
      g.primitive = dnnl::matmul(g.pd);
      g.scratchpad_bytes = g.pd.scratchpad_desc().get_size();
    } catch (const dnnl::error& e) {
      throw Error(
          "matmul: oneDNN cannot build a single-thread bf16 GEMM for M=" + std::to_string(rows) +
          " N=" + std::to_string(N) + " K=" + std::to_string(K) + ": " + e.what());
    }
    return chunk_cache.emplace(key, std::move(g)).first->second;
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

  CachedGemm& primitive_for(const GemmShape& s) {
    auto found = cache.find(s);
    if (found != cache.end()) return found->second;
    if (cache.size() >= kMaxCachedPrimitives) cache.clear();
    using dt = dnnl::memory::data_type;
    const dt in_type = s.use_bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a_md({s.M, s.K}, in_type, {s.a_stride_m, s.a_stride_k});
    const dnnl::memory::desc b_md({s.K, s.N}, in_type, {s.b_stride_k, s.b_stride_n});
    const dnnl::memory::desc c_md({s.M, s.N}, dt::f32, {s.ldc, 1});
    const dnnl::memory::desc bias_md({1, s.N}, dt::f32, {s.N, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (s.alpha() != 1.0f) attr.set_output_scales(0, {s.alpha()});
    if (s.beta() != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(s.beta());
      attr.set_post_ops(ops);
    }
    CachedGemm g;
    try {
      auto desc = s.has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                             : dnnl::matmul::desc(a_md, b_md, c_md);
      dnnl::matmul::primitive_desc pd(desc, attr, engine);
      g.primitive = dnnl::matmul(pd);
      // Placeholder pointers; run() sets the real ones.
      g.a = dnnl::memory(a_md, engine, nullptr);
      g.b = dnnl::memory(b_md, engine, nullptr);
      g.c = dnnl::memory(c_md, engine, nullptr);
      g.args = {{DNNL_ARG_SRC, g.a}, {DNNL_ARG_WEIGHTS, g.b}, {DNNL_ARG_DST, g.c}};
      if (s.has_bias) {
        g.bias = dnnl::memory(bias_md, engine, nullptr);
        g.args.emplace(DNNL_ARG_BIAS, g.bias);
      }
      g.scratchpad_bytes = pd.scratchpad_desc().get_size();
      if (g.scratchpad_bytes > 0) {
        g.scratchpad = dnnl::memory(pd.scratchpad_desc(), engine, nullptr);
        g.args.emplace(DNNL_ARG_SCRATCHPAD, g.scratchpad);
      }
    } catch (const dnnl::error& e) {
      throw Error("matmul: oneDNN cannot build a " + std::string(s.use_bf16 ? "bf16" : "fp32") +
                  " GEMM for M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                  " K=" + std::to_string(s.K) + ": " + e.what());
    }
    return cache.emplace(s, std::move(g)).first->second;
  }

  // `elements` bf16 values widened to fp32 into widened[slot] (threaded).
  const float* widen(int slot, const bf16* src, int64_t elements) {
    auto* dst = static_cast<float*>(
        widened[static_cast<size_t>(slot)].reserve(static_cast<size_t>(elements) * sizeof(float)));
    convert_to_f32(dst, src, elements);
    return dst;
  }

  // run() for a bf16 shape on widened operands: A and B widened whole (with their strides) and
  // multiplied by sgemm, the bias added after the sums as oneDNN's bf16 matmul and the row-chunk
  // products add it (a bias comes with beta 0).
  void run_widened(const GemmShape& s, const void* A, const void* B, const float* bias, float* C) {
    // A is stored [M, K] (rows a_stride_m apart) or, read transposed, [K, M]; B [K, N] or [N, K].
    const bool a_rows = s.a_stride_k == 1 && (s.M == 1 || s.a_stride_m >= s.K);
    const bool b_rows = s.b_stride_n == 1 && (s.K == 1 || s.b_stride_k >= s.N);
    check((a_rows || s.a_stride_m == 1) && (b_rows || s.b_stride_k == 1),
          "matmul: a widened bf16 GEMM needs operands with one unit stride");
    const int64_t lda = a_rows ? std::max(s.a_stride_m, s.K) : std::max(s.a_stride_k, s.M);
    const int64_t ldb = b_rows ? std::max(s.b_stride_k, s.N) : std::max(s.b_stride_n, s.K);
    const float* a32 = widen(0, static_cast<const bf16*>(A),
                             a_rows ? (s.M - 1) * lda + s.K : (s.K - 1) * lda + s.M);
    const float* b32 = widen(1, static_cast<const bf16*>(B),
                             b_rows ? (s.K - 1) * ldb + s.N : (s.N - 1) * ldb + s.K);
    check(!s.has_bias || s.beta() == 0.0f,
          "matmul: a widened bf16 GEMM takes a bias only without beta");
    sgemm(!a_rows, !b_rows, s.M, s.N, s.K, s.alpha(), a32, lda, b32, ldb, s.beta(), C, s.ldc);
    if (!s.has_bias) return;
#pragma omp parallel for schedule(static) if (s.M * s.N > (1 << 16))
    for (int64_t i = 0; i < s.M; ++i) add_bias_rows(C + i * s.ldc, bias, 1, s.N);
  }

  // Runs C = alpha * A · B (+ bias) (+ beta * C) for the given shape; sizes must be positive.
  void run(const GemmShape& s, const void* A, const void* B, const float* bias, float* C) {
    if (s.use_bf16 && widen_bf16) return run_widened(s, A, B, bias, C);
    CachedGemm& g = primitive_for(s);
    g.a.set_data_handle(const_cast<void*>(A));
    g.b.set_data_handle(const_cast<void*>(B));
    g.c.set_data_handle(C);
    if (s.has_bias) g.bias.set_data_handle(const_cast<float*>(bias));
    if (g.scratchpad_bytes > 0)
      g.scratchpad.set_data_handle(scratchpad.reserve(g.scratchpad_bytes));
    g.primitive.execute(stream, g.args);
    stream.wait();
  }

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

MatmulEngine::MatmulEngine(const MatmulOptions& options) : impl_(std::make_unique<Impl>(options)) {}

MatmulEngine::MatmulEngine(Bf16FallbackGemm bf16_fallback)
    : MatmulEngine([bf16_fallback] {
        MatmulOptions options = MatmulOptions::from_environment();
        if (bf16_fallback != Bf16FallbackGemm::automatic) options.bf16_fallback = bf16_fallback;
        return options;
      }()) {}
MatmulEngine::~MatmulEngine() = default;

bool MatmulEngine::onednn_bf16_available() {
  return onednn_builds_bf16_gemms();
}

Bf16FallbackGemm MatmulEngine::bf16_fallback() const {
  return impl_->widen_bf16 ? Bf16FallbackGemm::widened_fp32 : Bf16FallbackGemm::onednn_bf16;
}

bool MatmulEngine::bf16_on_fp32_units() const {
  return impl_->widen_bf16 && !impl_->amx;
}

std::string MatmulEngine::bf16_gemms() const {
  const bool amx = onednn_has_amx();
  if (bf16_on_fp32_units())
    return amx ? "bf16 GEMMs on fp32 units (operands widened: LATTICE_MATMUL_BF16_FALLBACK=fp32)"
               : "bf16 GEMMs on fp32 units (operands widened: oneDNN finds no AMX on this CPU)";
  if (impl_->widen_bf16)
    return "bf16 GEMMs on Lattice's AMX kernels where they apply, else widened to fp32 "
           "(LATTICE_MATMUL_BF16_FALLBACK=fp32)";
  if (impl_->amx) return "bf16 GEMMs on AMX (Lattice's kernels and oneDNN)";
  return amx ? "bf16 GEMMs on oneDNN's AMX matmul"
             : "bf16 GEMMs on oneDNN's AVX512-BF16 matmul (no AMX on this CPU; "
               "LATTICE_MATMUL_BF16_FALLBACK=onednn)";
}

int64_t MatmulEngine::scratch_bytes() const {
  size_t total = impl_->scratchpad.capacity();
  for (const auto& buffer : impl_->widened) total += buffer.capacity();
  for (const auto& buffer : impl_->bf16_operands) total += buffer.capacity();
  for (const auto& buffer : impl_->packed_weights) total += buffer.capacity();
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
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) {
      if (bias != nullptr)
        std::memcpy(out + i * N, bias, static_cast<size_t>(N) * sizeof(float));
      else
        std::fill(out + i * N, out + (i + 1) * N, 0.0f);
    }
    return;
  }
  if (precision == Precision::fp32) {  // out = in · weight^T (+ bias, pre-filled and kept: beta 1)
    if (bias != nullptr) broadcast_rows(out, bias, M, N);
    return sgemm(false, true, M, N, K, 1.0f, in, K, weight, K, bias != nullptr ? 1.0f : 0.0f, out,
                 N);
  }
  GemmShape s = Impl::shape(M, N, K, /*use_bf16=*/true);
  s.a_stride_m = K, s.a_stride_k = 1;  // in[M,K]
  s.b_stride_k = 1, s.b_stride_n = K;  // weight[N,K] read as its transpose [K,N]
  s.ldc = N;
  s.has_bias = bias != nullptr;
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
    if (want_d_weight) sgemm(true, false, N, K, M, 1.0f, d_out, N, in, K, 1.0f, d_weight, K);
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
      sgemm(true, false, N, K, M, 1.0f, d_out32, N, impl_->widen(1, in16, M * K), K, 1.0f, d_weight,
            K);
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

bool MatmulEngine::vocab_blocked_head_applies(int64_t K) {
  static const bool amx_kernels = MatmulOptions::from_environment().amx_kernels;
  return amx_kernels && amx_packed_gemm_enabled() && vocab_blocked_head_rows_per_pass(K) > 0;
}

int MatmulEngine::vocab_blocked_lanes(int64_t M) {
  // At least 256 rows per lane: fewer would re-read the head weight for little work.
  return static_cast<int>(std::clamp<int64_t>(M / 256, 1, omp_get_max_threads()));
}

void MatmulEngine::head_cross_entropy_vocab_blocked(const lattice::bf16* in16, WeightOperand weight,
                                                    int64_t M, int64_t K, int64_t V,
                                                    const int32_t* targets, float grad_scale,
                                                    double* row_losses, float* d_in,
                                                    float* weight_grad_partials, int lanes) {
  check(M > 0 && V > 0 && amx_packed_gemm_enabled() && vocab_blocked_head_rows_per_pass(K) > 0,
        "matmul head_cross_entropy_vocab_blocked: needs M, V > 0, AMX and a width the kernel takes "
        "(vocab_blocked_head_applies), got M=" +
            std::to_string(M) + " K=" + std::to_string(K) + " V=" + std::to_string(V));
  check(lanes == vocab_blocked_lanes(M),
        "matmul head_cross_entropy_vocab_blocked: lanes must be vocab_blocked_lanes(M) (" +
            std::to_string(vocab_blocked_lanes(M)) + "), got " + std::to_string(lanes));
  const lattice::bf16* weight16 = impl_->rounded_weight(weight, V, K);  // rounded once
  const auto packed_bytes =
      static_cast<size_t>(vocab_blocked_head_packed_elements(V, K)) * sizeof(uint16_t);
  auto* forward = static_cast<uint16_t*>(impl_->packed_weights[0].reserve(packed_bytes));
  auto* backward = static_cast<uint16_t*>(impl_->packed_weights[1].reserve(packed_bytes));
  pack_vocab_blocked_head(forward, backward, weight16, V, K);
  const int64_t pass_rows = vocab_blocked_head_rows_per_pass(K);
  impl_->reserve_thread_buffers(lanes, 0, 0, vocab_blocked_head_scratch_bytes(pass_rows, K));
  ChunkFailure failure;
#pragma omp parallel num_threads(lanes)
  {
    void* scratch = impl_->thread_scratchpads[static_cast<size_t>(omp_get_thread_num())].reserve(0);
    for (int lane = omp_get_thread_num(); lane < lanes; lane += omp_get_num_threads()) {
      const int64_t first = M * lane / lanes, stop = M * (lane + 1) / lanes;
      float* partial = weight_grad_partials + static_cast<int64_t>(lane) * V * K;
      for (int64_t begin = first; begin < stop; begin += pass_rows) {
        failure.run([&] {
          vocab_blocked_head_pass(row_losses + begin, d_in + begin * K, partial, begin == first,
                                  in16 + begin * K, targets + begin,
                                  std::min(pass_rows, stop - begin), K, V, grad_scale, forward,
                                  backward, scratch);
        });
      }
    }
  }
  failure.rethrow();
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
