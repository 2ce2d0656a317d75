// Grouped-query attention (causal or unmasked, query and key positions given by offsets), forward
// and backward, tiled as flash attention: the extra memory is O(T) (the log-sum-exp per query),
// never O(T^2). The forward's log-sum-exp lets results over separate key blocks be merged exactly
// (attention_merge_partial) and the backward run block by block (ring attention).
#pragma once

#include <cstdint>
#include <optional>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/attention_shape.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/precision.hpp"

namespace lattice::kernels {

// out: [batch, q_len, q_heads * head_dim] contiguous. lse: [batch, q_heads, q_len], the log-sum-exp
// of each query's scaled scores, saved for backward.
// Precision::fp32 computes in fp32. Precision::bf16 rounds q, k, v (and d_out) and the
// probabilities P (and dS) to bf16 before the products, accumulating in fp32 with fp32 softmax
// statistics (PyTorch autocast's bf16 SDPA); the products run on AMX where the CPU has it (unless
// options.allow_amx is false; every shape, offset and mask runs on either path). Results do not
// depend on the thread count. Scratch per thread: about 2 * kv_len * head_dim floats (forward) and
// 3 * (q_heads / kv_heads) * q_len * head_dim floats (backward); never O(T^2). `matmul` is not used
// (tile products run on the kernel's own micro-GEMMs); it stays in the signature for callers and
// later backends.
//
// Block by block (ring attention, chunked long sequences): call once per block of keys with that
// block's k, v and kv_len, k_offset its first position and the full call's q_offset given
// explicitly, and fold the blocks' out and lse together with attention_merge_partial.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, Precision precision, MatmulEngine& matmul,
                       const AttentionOptions& options = {});

// dq, dk, dv use the same strides as q, k, v; dk and dv are overwritten, dq too unless
// options.accumulate_dq. `out` and `lse` are the forward's over all the keys the queries attend.
//
// Block by block (ring attention): split the keys into blocks, each a call with that block's k, v,
// dk, dv (pointers and kv_len of the block, k_offset its first position) and the same explicit
// q_offset; pass every call the final out and lse (merged over all blocks) and d_out, and
// options.accumulate_dq with dq zeroed before the first block. The blocks' dk, dv and the summed
// dq equal the full backward's up to the order of dq's fp32 sums over the blocks.
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

// d_out and out are fp32 [batch, q_len, q_heads * head_dim]; any AttentionShape the fp32 calls
// take (general offsets and masks included). options.accumulate_dq is an error here.
void attention_backward_bf16(const AttentionGradientsBf16& grads, const float* d_out,
                             const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                             const float* out, const float* lse, const AttentionShape& shape,
                             const AttentionOptions& options = {});

// Merges a partial attention result over one block of keys into a running result over others, as
// if the softmax had run over both: with w = e^lse and w_p = e^part_lse per query,
// out = (w out + w_p part_out) / (w + w_p) and lse = log(w + w_p), computed relative to
// max(lse, part_lse) in double, so nothing overflows. A part with lse -inf (its block holds no key
// the query sees) changes nothing; a running lse of -inf (no key so far) takes the part as it is.
// Start from out 0 and lse -inf, or from the first block's result. out and part_out: [batch, q_len,
// q_heads * head_dim] contiguous; lse and part_lse: [batch, q_heads, q_len]. Element-wise:
// independent of the thread count.
void attention_merge_partial(float* out, float* lse, const float* part_out, const float* part_lse,
                             int64_t batch, int64_t q_len, int64_t q_heads, int64_t head_dim);

}  // namespace lattice::kernels
