// The description of one attention call that every backend takes: the layout of q, k and v, the
// query and key positions, the mask, and the choices beyond the shape (attention_shape.cpp holds
// the constructors). The kernels are the backends' (kernels/cpu/attention.hpp).
#pragma once

#include <cstdint>
#include <optional>

namespace lattice::kernels {

// Which keys a query attends: causal (keys at positions <= the query's own) or none (every key).
enum class AttentionMask { causal, none };

// Layout of q, k, v: token rows of [heads, head_dim] for q and k and [heads, value_dim()] for v
// (v_head_dim 0: the value heads are head_dim wide, as in GPT-2 and Llama; a different width as in
// DeepSeek's multi-head latent attention, whose values are narrower than its query-key heads);
// `*_row_stride` elements between consecutive tokens and `*_batch_stride` between batches (v's
// is k's unless v_batch_stride says otherwise: values of their own width in their own buffer), so
// q/k/v may be slices of one packed qkv buffer or a KV cache. Query head h uses kv head
// h / (q_heads / kv_heads). Scale is 1/sqrt(head_dim). The output and its gradient are
// [batch, q_len, q_heads * value_dim()].
//
// Sliding window (causal only; Mistral's): with window W > 0 the query at position p sees the keys
// at positions p - W + 1 ... p (itself and the W - 1 before it); 0 means no window.
//
// Positions: query i (0 <= i < q_len) sits at absolute position q_offset + i and key j
// (0 <= j < kv_len) at k_offset + j. Without q_offset the queries are the last q_len positions of
// the keys, q_offset = k_offset + kv_len - q_len (training, where q_len == kv_len, and a KV cache's
// new tokens); that rule needs kv_len >= q_len. With explicit offsets the lengths are free, so a
// call can cover one block of keys (ring attention, chunked long sequences). Offsets are
// non-negative.
//
// A query that sees no key (causal, its position before k_offset) gets output 0 and lse -inf, and
// its rows contribute nothing to dq, dk, dv (dq rows 0); a key no query sees gets dk = dv = 0.
struct AttentionShape {
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t v_head_dim = 0;  // 0: head_dim
  int64_t window = 0;      // 0: no sliding window
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0;
  int64_t q_batch_stride = 0, kv_batch_stride = 0;
  int64_t v_batch_stride = 0;       // 0: kv_batch_stride
  std::optional<int64_t> q_offset;  // unset: k_offset + kv_len - q_len
  int64_t k_offset = 0;
  AttentionMask mask = AttentionMask::causal;

  // q_offset, or the default rule above.
  int64_t query_offset() const { return q_offset.value_or(k_offset + kv_len - q_len); }
  // The width of one value head (and of one output head).
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  // The elements between v's (and dv's) batches.
  int64_t value_batch_stride() const {
    return v_batch_stride > 0 ? v_batch_stride : kv_batch_stride;
  }

  // Training layout: separate contiguous q [B,T,Hq*D], k and v [B,T,Hkv*D].
  static AttentionShape contiguous(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim);
  // Contiguous q [B,q_len,Hq*D], k and v [B,kv_len,Hkv*D] (offsets and mask left at defaults).
  static AttentionShape contiguous(int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                                   int64_t kv_heads, int64_t head_dim);
};

// Choices of a call beyond its shape (the defaults are what the model uses).
struct AttentionOptions {
  // Precision::bf16 multiplies on AMX tiles where the build targets AMX and Linux grants the tile
  // state; false forces the portable bf16 path (the same rounding with fp32 products: its results
  // differ from AMX's only in the order of fp32 accumulation), for comparison and tests.
  bool allow_amx = true;
  // Backward only: dq += this call's dQ instead of dq = it (dk and dv are always overwritten).
  // attention_backward_bf16 rejects it (its dq is rounded to bf16 per call).
  bool accumulate_dq = false;
};

}  // namespace lattice::kernels
