// MatmulEngine's oneDNN primitive cache (matmul_engine.hpp): whole-batch GEMM primitives keyed by
// shape, layout, scaling and thread count, kept with their argument memories; single-thread
// row-chunk primitives; running a cached shape (or its widened fp32 form); and the threaded AMX
// weight gradient.
#include <omp.h>

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/core/scoped_omp_threads.hpp"
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"

namespace lattice::kernels {

// d_weight[N, K] (+)= d_out16^T · in16 on the AMX weight-gradient kernel: the threads split the
// longer of d_weight's two sides in 32-wide blocks (each thread then packs the whole of the
// operand along the other side, the smaller), every thread sweeping all M rows.
void MatmulEngine::Impl::amx_weight_gradient(float* d_weight, const bf16* d_out16, const bf16* in16,
                                             int64_t M, int64_t N, int64_t K, bool accumulate) {
  const int threads = omp_get_max_threads();
  const WeightGradientUpdate update =
      accumulate ? WeightGradientUpdate::add : WeightGradientUpdate::overwrite;
  const bool split_rows = N >= K;
  const int64_t blocks = (split_rows ? N : K) / 32;
  const auto range = [&](int t) {
    return std::pair<int64_t, int64_t>{blocks * t / threads * 32, blocks * (t + 1) / threads * 32};
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

ChunkGemm& MatmulEngine::Impl::chunk_primitive_for(int64_t rows, int64_t N, int64_t K,
                                                   ChunkGemmKind kind) {
  const std::array<int64_t, 4> key{rows, N, K, static_cast<int64_t>(kind)};
  auto found = chunk_cache.find(key);
  if (found != chunk_cache.end()) return found->second;
  using dt = dnnl::memory::data_type;
  const bool gradient =
      kind == ChunkGemmKind::weight_gradient || kind == ChunkGemmKind::weight_gradient_accumulate;
  const dnnl::memory::desc a_md({rows, K}, dt::bf16,
                                gradient ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{K, 1});
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

CachedGemm& MatmulEngine::Impl::primitive_for(const GemmShape& s) {
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

// run() for a bf16 shape on widened operands: A and B widened whole (with their strides) and
// multiplied by sgemm, the bias added after the sums as oneDNN's bf16 matmul and the row-chunk
// products add it (a bias comes with beta 0).
void MatmulEngine::Impl::run_widened(const GemmShape& s, const void* A, const void* B,
                                     const float* bias, float* C) {
  // A is stored [M, K] (rows a_stride_m apart) or, read transposed, [K, M]; B [K, N] or [N, K].
  const bool a_rows = s.a_stride_k == 1 && (s.M == 1 || s.a_stride_m >= s.K);
  const bool b_rows = s.b_stride_n == 1 && (s.K == 1 || s.b_stride_k >= s.N);
  check((a_rows || s.a_stride_m == 1) && (b_rows || s.b_stride_k == 1),
        "matmul: a widened bf16 GEMM needs operands with one unit stride");
  const int64_t lda = a_rows ? std::max(s.a_stride_m, s.K) : std::max(s.a_stride_k, s.M);
  const int64_t ldb = b_rows ? std::max(s.b_stride_k, s.N) : std::max(s.b_stride_n, s.K);
  const float* a32 =
      widen(0, static_cast<const bf16*>(A), a_rows ? (s.M - 1) * lda + s.K : (s.K - 1) * lda + s.M);
  const float* b32 =
      widen(1, static_cast<const bf16*>(B), b_rows ? (s.K - 1) * ldb + s.N : (s.N - 1) * ldb + s.K);
  check(!s.has_bias || s.beta() == 0.0f,
        "matmul: a widened bf16 GEMM takes a bias only without beta");
  sgemm(!a_rows, !b_rows, s.M, s.N, s.K, s.alpha(), a32, lda, b32, ldb, s.beta(), C, s.ldc);
  if (!s.has_bias) return;
#pragma omp parallel for schedule(static) if (s.M * s.N > (1 << 16))
  for (int64_t i = 0; i < s.M; ++i) add_bias_rows(C + i * s.ldc, bias, 1, s.N);
}

// Runs C = alpha * A · B (+ bias) (+ beta * C) for the given shape; sizes must be positive.
void MatmulEngine::Impl::run(const GemmShape& s, const void* A, const void* B, const float* bias,
                             float* C) {
  if (s.use_bf16 && widen_bf16) return run_widened(s, A, B, bias, C);
  CachedGemm& g = primitive_for(s);
  g.a.set_data_handle(const_cast<void*>(A));
  g.b.set_data_handle(const_cast<void*>(B));
  g.c.set_data_handle(C);
  if (s.has_bias) g.bias.set_data_handle(const_cast<float*>(bias));
  if (g.scratchpad_bytes > 0) g.scratchpad.set_data_handle(scratchpad.reserve(g.scratchpad_bytes));
  g.primitive.execute(stream, g.args);
  stream.wait();
}

}  // namespace lattice::kernels
