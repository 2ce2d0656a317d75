// Causal self-attention with grouped-query heads, forward and backward, tiled as flash attention:
// the extra memory is O(T) (the log-sum-exp per query), never O(T^2).
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/cpu/precision.hpp"

namespace lattice::kernels {

// Layout of q, k, v: token rows of [heads, head_dim]; `*_row_stride` elements between consecutive
// tokens and `*_batch_stride` between batches, so q/k/v may be slices of one packed qkv buffer or a
// KV cache. Query i (0-based among q_len) sits at absolute position kv_len - q_len + i and attends
// keys 0..that position. Query head h uses kv head h / (q_heads / kv_heads). Scale is
// 1/sqrt(head_dim).
struct AttentionShape {
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0;
  int64_t q_batch_stride = 0, kv_batch_stride = 0;

  // Training layout: separate contiguous q [B,T,Hq*D], k and v [B,T,Hkv*D].
  static AttentionShape contiguous(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim);
};

// How a call runs, not what it computes (the defaults are what the model uses).
struct AttentionOptions {
  // Precision::bf16 multiplies on AMX tiles where the build targets AMX and Linux grants the tile
  // state; false forces the portable bf16 path (the same rounding with fp32 products: its results
  // differ from AMX's only in the order of fp32 accumulation), for comparison and tests.
  bool allow_amx = true;
};

// out: [batch, q_len, q_heads * head_dim] contiguous. lse: [batch, q_heads, q_len], the log-sum-exp
// of each query's scaled scores, saved for backward.
// Precision::fp32 computes in fp32. Precision::bf16 rounds q, k, v (and d_out) and the
// probabilities P (and dS) to bf16 before the products, accumulating in fp32 with fp32 softmax
// statistics (PyTorch autocast's bf16 SDPA); the products run on AMX where the CPU has it (unless
// options.allow_amx is false). Results do not depend on the thread
// count. Scratch per thread: about 2 * kv_len * head_dim floats (forward) and 3 * (q_heads /
// kv_heads) * q_len * head_dim floats (backward); never O(T^2). `matmul` is not used (tile products
// run on the kernel's own micro-GEMMs); it stays in the signature for callers and later backends.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, Precision precision, MatmulEngine& matmul,
                       const AttentionOptions& options = {});

// Requires q_len == kv_len. dq, dk, dv use the same strides as q, k, v and are overwritten.
void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& shape, Precision precision, MatmulEngine& matmul,
                        const AttentionOptions& options = {});

// Precision::bf16 attention on q, k, v that are already bf16 (e.g. a QKV projection's output
// rounded as it is produced: the fp32 q, k, v never exist). Same layout rules as above; the results
// equal attention_forward / attention_backward's with Precision::bf16 on the fp32 values these
// round from, bit for bit.
void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q, const lattice::bf16* k,
                            const lattice::bf16* v, const AttentionShape& shape,
                            const AttentionOptions& options = {});

// Where attention_backward_bf16 writes: dq, dk, dv rounded to bf16 (same strides as q, k, v) and,
// when dq_sums, dk_sums and dv_sums are all given, each batch's column sums of the unrounded
// gradients in double, summed over the batch's tokens in order: dq_sums[b * sums_batch_stride + h *
// head_dim + d] for query head h, dk_sums / dv_sums likewise for kv heads (overwritten). A Linear
// that produced q, k, v adds them up as its bias gradient, and runs its backward on the bf16 rows.
struct AttentionGradientsBf16 {
  lattice::bf16* dq = nullptr;
  lattice::bf16* dk = nullptr;
  lattice::bf16* dv = nullptr;
  double* dq_sums = nullptr;
  double* dk_sums = nullptr;
  double* dv_sums = nullptr;
  int64_t sums_batch_stride = 0;
};

// Requires q_len == kv_len. d_out and out are fp32 [batch, q_len, q_heads * head_dim].
void attention_backward_bf16(const AttentionGradientsBf16& grads, const float* d_out,
                             const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                             const float* out, const float* lse, const AttentionShape& shape,
                             const AttentionOptions& options = {});

}  // namespace lattice::kernels
