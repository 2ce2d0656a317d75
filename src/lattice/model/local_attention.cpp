// The one-rank attention: see local_attention.hpp.
#include "lattice/model/local_attention.hpp"

namespace lattice::model {

void LocalAttention::forward(kernels::Ops& ops, float* out, float* lse, const float* q,
                             const float* k, const float* v, const kernels::AttentionShape& local,
                             kernels::Precision precision) {
  ops.attention_forward(out, lse, q, k, v, local, precision, {});
}

void LocalAttention::backward(kernels::Ops& ops, float* dq, float* dk, float* dv,
                              const float* d_out, const float* q, const float* k, const float* v,
                              const float* out, const float* lse,
                              const kernels::AttentionShape& local, kernels::Precision precision) {
  ops.attention_backward(dq, dk, dv, d_out, q, k, v, out, lse, local, precision, {});
}

void LocalAttention::forward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker, float* out,
                                         float* lse, const lattice::bf16* qkv16, int64_t width,
                                         int64_t k_column, int64_t v_column,
                                         const kernels::AttentionShape& local) {
  (void)tracker, (void)width;
  ops.attention_forward_bf16(out, lse, qkv16, qkv16 + k_column, qkv16 + v_column, local, {});
}

void LocalAttention::backward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker,
                                          lattice::bf16* d_qkv16, float* column_sums,
                                          const float* d_out, const lattice::bf16* qkv16,
                                          int64_t width, int64_t k_column, int64_t v_column,
                                          const float* out, const float* lse,
                                          const kernels::AttentionShape& local) {
  (void)tracker, (void)width;
  ops.attention_backward_bf16(d_qkv16, d_qkv16 + k_column, d_qkv16 + v_column, column_sums, d_out,
                              qkv16, qkv16 + k_column, qkv16 + v_column, out, lse, local, {});
}

}  // namespace lattice::model
