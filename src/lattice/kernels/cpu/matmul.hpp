// Matmul through oneDNN: the Linear layer's forward and backward (weights stored [out, in] as in
// PyTorch), in fp32 or bf16 (AMX) with fp32 accumulation. The engine caches primitives and scratch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/linear_operands.hpp"
#include "lattice/kernels/precision.hpp"

namespace lattice::kernels {

// d_out[M,N] rounded to bf16 into d_out16 (dense [M,N]) and, in the same pass, d_bias[j] += the
// column sums of d_out (in double, row by row: independent of the thread count; skipped when
// d_bias is null). The pass a bf16 Linear backward makes over its fp32 d_out.
void round_to_bf16_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out,
                                    int64_t M, int64_t N);

// How the engine computes the bf16 products that do not run on Lattice's own AMX kernels (all of
// them on a CPU without AMX). Either way the operands are the same bf16 values, their products are
// exact and the sums are fp32; the two agree to fp32 rounding.
enum class Bf16FallbackGemm {
  // widened_fp32 where oneDNN finds no AMX on this CPU, else onednn_bf16 (the setting
  // LATTICE_MATMUL_BF16_FALLBACK=onednn or =fp32 chooses instead: MatmulOptions).
  automatic,
  // oneDNN's bf16 matmul: AMX where the CPU has it, else AVX512-BF16 dot products (vdpbf16ps),
  // which on a host without AMX ran at half the fp32 GEMM rate (docs/performance.md). oneDNN 2.6
  // builds none without AVX-512 (MatmulEngine::onednn_bf16_available): an engine asked for it
  // there throws an Error naming the fallback to use.
  onednn_bf16,
  // The bf16 operands widened to fp32 (exactly: a bf16 is the top half of an fp32) and multiplied
  // by oneDNN's fp32 sgemm on the FMA units.
  widened_fp32,
};

// How a MatmulEngine computes, as its caller chooses (the defaults choose from the CPU). The
// engine never reads the environment; from_environment() is where the command line's settings
// come from.
struct MatmulOptions {
  Bf16FallbackGemm bf16_fallback = Bf16FallbackGemm::automatic;
  // Lattice's own AMX kernels (amx_packed_gemm.hpp, amx_weight_gradient.hpp) for the products of
  // forward, backward and the row-chunk calls where the CPU has AMX; false puts them on oneDNN
  // (for comparison: the weight gradients then differ in the last bits, as the sum order does).
  bool amx_kernels = true;

  // The documented settings, read from the environment once per call: LATTICE_MATMUL_BF16_FALLBACK
  // = onednn | fp32 (bf16_fallback onednn_bf16 | widened_fp32; unset or empty: automatic) and
  // LATTICE_MATMUL_NO_AMX_PACKED = 1 (amx_kernels false; unset, empty or 0: true). A value that is
  // no choice throws an Error naming the choices (docs/training.md).
  static MatmulOptions from_environment();
};

class MatmulEngine {
 public:
  explicit MatmulEngine(const MatmulOptions& options);
  // The environment's settings (MatmulOptions::from_environment), with `bf16_fallback` instead of
  // the environment's where it is not automatic: how the command line and the tests build engines.
  explicit MatmulEngine(Bf16FallbackGemm bf16_fallback = Bf16FallbackGemm::automatic);
  ~MatmulEngine();
  MatmulEngine(const MatmulEngine&) = delete;
  MatmulEngine& operator=(const MatmulEngine&) = delete;

  // out[M,N] = in[M,K] · weight[N,K]^T (+ bias[N] when bias is not null). out is overwritten.
  // In bf16, on Lattice's AMX kernel (multiply_in_row_chunks into out) where the CPU has AMX, K
  // and N are multiples of 32 and M is at least 256; else on oneDNN.
  void forward(float* out, const float* in, const float* weight, const float* bias, int64_t M,
               int64_t K, int64_t N, Precision precision, const Bf16Operands& keep = {});

  // Given d_out[M,N]:
  //   d_in[M,K]      = d_out · weight          (overwritten; skipped when d_in is null)
  //   d_weight[N,K] += d_out^T · in            (accumulated; skipped when null)
  //   d_bias[N]     += sum over rows of d_out  (accumulated; skipped when null)
  // With `rounded` (bf16 only) the given bf16 operands replace rounding in / weight / d_out; d_out
  // may then be null unless d_bias is wanted, `in` / `weight` null when their copy is given.
  // In bf16 the weight gradient runs on the AMX weight-gradient kernel where N and K are multiples
  // of 32 (amx_weight_gradient.hpp: each element summed over the M rows in order from zero, then
  // added; the same for any thread count), else on oneDNN; the two agree to fp32 rounding (bit
  // for bit up to 256 rows, where oneDNN also sums in order). The input gradient runs on the AMX
  // kernel where forward's would with K and N swapped (the weight packed as stored), else on
  // oneDNN.
  void backward(float* d_in, float* d_weight, float* d_bias, const float* d_out, const float* in,
                const float* weight, int64_t M, int64_t K, int64_t N, Precision precision,
                const Bf16Operands& rounded = {});

  // bf16 only: out[M,N] = in16[M,K] · op(weight) computed in chunks of `chunk_rows` rows spread
  // over the threads of one OpenMP region, op(weight) = weight[N,K]^T when weight_transposed (a
  // Linear's forward) else weight[K,N] (a Linear's input gradient, d_out · W). Each chunk's GEMM
  // runs on one thread into that thread's buffer [rows, N], and `consume(row_begin, rows, chunk)`
  // runs right after on the same thread, while the chunk is still in cache: the whole [M, N]
  // output is never written to memory (the LM head and its cross-entropy, a GELU backward), unless
  // `destination` [M, N] is given: then each chunk is written to its rows there (and handed to
  // consume from there), for an output that must be kept. When bias[N] is given it is added to
  // every row first. The weight is rounded once per call; where K and N are multiples of 32 and
  // the CPU has AMX it is also packed once into the tile layout and the chunks run on
  // amx_packed_gemm.hpp's kernel (in passes of rows whose fp32 output fits in L2, each handed to
  // consume in turn), otherwise on oneDNN's single-thread GEMMs reading it in place. Each element
  // equals forward()'s and backward()'s (same K order, same bias add) bit for bit where both sweep
  // K in order, as on the Linears of the demo and benchmark models; oneDNN's whole product splits
  // some reductions (a narrow output of 16-32 columns, e.g. the tiny test presets' d_model of 32;
  // an 8192-long K, the small benchmark's LM-head input gradient) and they then agree to fp32
  // rounding. On widened fp32 operands (Bf16FallbackGemm::widened_fp32) each chunk is one
  // single-thread sgemm, whose kernels differ with the row count: chunks and the whole product
  // then agree to fp32 rounding.
  using ChunkConsumer = std::function<void(int64_t row_begin, int64_t rows, const float* chunk)>;
  void multiply_in_row_chunks(const lattice::bf16* in16, WeightOperand weight,
                              bool weight_transposed, int64_t M, int64_t K, int64_t N,
                              int64_t chunk_rows, const ChunkConsumer& consume,
                              const float* bias = nullptr, float* destination = nullptr);

  // bf16 only: a Linear's forward and backward in one pass over row chunks, for an output that is
  // consumed at once and whose gradient the consumer computes from it (the LM head and its
  // cross-entropy, as Liger-Kernel's fused linear cross-entropy: neither the logits nor their
  // gradient is ever stored whole). Each chunk of `chunk_rows` rows runs on one thread:
  //   out[rows, N] = in16 · weight^T                  (fp32, the thread's buffer)
  //   consume(row_begin, rows, out, d_out16, stride)  must write d_out16 [rows, N] (bf16)
  //   d_in[rows, K] = d_out16 · weight                (d_in [M, K]; overwritten)
  //   partial[N, K] (+)= d_out16^T · in16 rows        (the first chunk of a lane overwrites)
  // The rows of `out` and d_out16 are `stride` apart (N, or N rounded up to 32 on AMX; what the
  // consumer writes past column N is ignored). Lane l of `lanes` (= gradient_lanes(M,
  // chunk_rows), one thread each) takes a contiguous run of chunks in order and sums their weight
  // gradients into weight_grad_partials + l·N·K; add the lanes in order (add_chunk_partials) to get
  // the weight gradient. Where K is a multiple of 32 and the CPU has AMX, the three products run on
  // Lattice's AMX kernels (amx_packed_gemm.hpp with the weight packed once each way, zero-padded
  // to N rounded up to 32: GPT-2's 50,257-token vocabulary; amx_weight_gradient.hpp, each chunk's
  // sums accumulated onto the lane's partial), else on oneDNN's single-thread GEMMs. The forward
  // is handed to consume in passes of fewer rows where 32 rows of output fit in L2. `out` and d_in
  // equal forward()'s and backward()'s rows bit for bit where both sweep K in order (see
  // multiply_in_row_chunks; a d_in summed over a vocabulary of thousands agrees to fp32 rounding,
  // and so does everything on widened fp32 operands); the weight gradient is the same sum in
  // another order (per chunk, then per lane), fixed by the thread count.
  using GradientChunkConsumer = std::function<void(
      int64_t row_begin, int64_t rows, const float* out, lattice::bf16* d_out16, int64_t stride)>;
  void forward_backward_in_row_chunks(const lattice::bf16* in16, WeightOperand weight, int64_t M,
                                      int64_t K, int64_t N, int64_t chunk_rows,
                                      const GradientChunkConsumer& consume, float* d_in,
                                      float* weight_grad_partials, int lanes);
  // The number of weight-gradient partials forward_backward_in_row_chunks needs: one per thread,
  // at most one per chunk.
  static int gradient_lanes(int64_t M, int64_t chunk_rows);

  // bf16 only: the LM head and its cross-entropy in one call on amx_vocab_blocked_head.hpp's
  // kernel, for a head whose width K it takes (vocab_blocked_head_applies: AMX, K a multiple of 32
  // and narrow enough that a pass of rows stays in L2). Lane l of `lanes` (vocab_blocked_lanes(M),
  // one thread each) takes rows [l·M/lanes, (l+1)·M/lanes) in passes, in order:
  //   row_losses[r] = the row's cross-entropy (0 where targets[r] < 0)
  //   d_in[r, :]    = d · weight, d the logits' gradient scaled by grad_scale (overwritten)
  //   weight_grad_partials + l·V·K = the lane's sum of d^T · in16 (overwritten)
  // The logits and d are never stored (see the kernel); add the lanes in order (add_chunk_partials)
  // for the weight gradient. Against forward_backward_in_row_chunks plus cross_entropy_rows_bf16:
  // losses agree to fp32 rounding (the softmax sum is formed block by block), and a value of d can
  // round to the neighbouring bf16 where its fp32 value sits on a rounding boundary.
  // (vocab_blocked_head_applies takes the environment's amx_kernels setting, as a default engine;
  // head_cross_entropy_vocab_blocked runs wherever the CPU has AMX, whatever the engine's options.)
  static bool vocab_blocked_head_applies(int64_t K);
  // Whether this engine's head takes the vocabulary-blocked kernel: its AMX kernels on
  // (MatmulOptions::amx_kernels), AMX here and a width K the kernel takes. What a caller holding
  // the engine should ask instead of the static vocab_blocked_head_applies.
  bool uses_vocab_blocked_head(int64_t K) const;
  static int vocab_blocked_lanes(int64_t M);
  void head_cross_entropy_vocab_blocked(const lattice::bf16* in16, WeightOperand weight, int64_t M,
                                        int64_t K, int64_t V, const int32_t* targets,
                                        float grad_scale, double* row_losses, float* d_in,
                                        float* weight_grad_partials, int lanes);

  // General row-major GEMM: C[M,N] = alpha · op(A) · op(B) + beta · C, op = transpose when the flag
  // is set. A is [M,K] (or [K,M] transposed), B is [K,N] (or [N,K] transposed), leading dimensions
  // are the row strides. Used by attention and anything else that is not a Linear layer.
  void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
            int64_t ldc, Precision precision);

  // Whether oneDNN builds bf16 matmul primitives on this CPU (AVX-512 and up; not on an AVX2-only
  // CPU or under ONEDNN_MAX_CPU_ISA=AVX2). Probed once per process.
  static bool onednn_bf16_available();
  // How this engine computes bf16 products off Lattice's AMX kernels (never automatic).
  Bf16FallbackGemm bf16_fallback() const;
  // Whether every bf16 product of this engine runs on the fp32 units (widened_fp32, and Lattice's
  // AMX kernels off (MatmulOptions::amx_kernels) or absent): then the fp32 GEMM's peak is the bf16
  // one.
  bool bf16_on_fp32_units() const;
  // One phrase naming where this engine's bf16 products run, for run banners, e.g. "bf16 GEMMs on
  // fp32 units (operands widened: oneDNN finds no AMX on this CPU)".
  std::string bf16_gemms() const;

  // Bytes of scratch the engine holds now (oneDNN scratchpad, bf16 operand copies and their fp32
  // widenings; grow-only), for memory accounting.
  int64_t scratch_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lattice::kernels
