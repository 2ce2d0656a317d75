// AttentionShape's constructors: the contiguous layouts of training and of a KV cache's new tokens.
#include "lattice/kernels/attention_shape.hpp"

namespace lattice::kernels {

AttentionShape AttentionShape::contiguous(int64_t batch, int64_t q_len, int64_t kv_len,
                                          int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  AttentionShape s;
  s.batch = batch;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.q_row_stride = q_heads * head_dim;
  s.k_row_stride = kv_heads * head_dim;
  s.v_row_stride = kv_heads * head_dim;
  s.q_batch_stride = q_len * q_heads * head_dim;
  s.kv_batch_stride = kv_len * kv_heads * head_dim;
  return s;
}

AttentionShape AttentionShape::contiguous(int64_t batch, int64_t seq, int64_t q_heads,
                                          int64_t kv_heads, int64_t head_dim) {
  return contiguous(batch, seq, seq, q_heads, kv_heads, head_dim);
}

}  // namespace lattice::kernels
