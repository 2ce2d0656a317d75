// Causal self-attention with grouped-query heads, forward and backward, tiled as flash attention:
// the extra memory is O(T) (the log-sum-exp per query), never O(T^2).
#pragma once

#include <cstdint>

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

// out: [batch, q_len, q_heads * head_dim] contiguous. lse: [batch, q_heads, q_len], the log-sum-exp
// of each query's scaled scores, saved for backward.
// Precision::fp32 computes in fp32. Precision::bf16 rounds q, k, v (and d_out) and the
// probabilities P (and dS) to bf16 before the products, accumulating in fp32 with fp32 softmax
// statistics (PyTorch autocast's bf16 SDPA); the products run on AMX where the CPU has it (set
// LATTICE_ATTENTION_NO_AMX=1 to force the portable path). Results do not depend on the thread
// count. Scratch per thread: about 2 * kv_len * head_dim floats (forward) and 3 * (q_heads /
// kv_heads) * q_len * head_dim floats (backward); never O(T^2). `matmul` is not used (tile products
// run on the kernel's own micro-GEMMs); it stays in the signature for callers and later backends.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, Precision precision, MatmulEngine& matmul);

// Requires q_len == kv_len. dq, dk, dv use the same strides as q, k, v and are overwritten.
void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& shape, Precision precision, MatmulEngine& matmul);

}  // namespace lattice::kernels
