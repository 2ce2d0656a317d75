// Position helpers of the context-parallel seam: see context_parallel.hpp.
#include "lattice/model/context_parallel.hpp"

#include "lattice/core/tensor.hpp"

namespace lattice::model {

namespace {
// An exact fp32 copy of the packed bf16 q, k, v.
Tensor widened(kernels::Ops& ops, MemoryTracker* tracker, const lattice::bf16* qkv16, int64_t rows,
               int64_t width) {
  Tensor wide({rows, width}, DType::f32, ops.memory(), tracker, MemoryCategory::activations);
  ops.convert_to_f32(wide.f32(), qkv16, rows * width);
  return wide;
}
int64_t packed_rows(const kernels::AttentionShape& s) {
  return s.batch * s.q_len;
}
}  // namespace

void ContextAttention::forward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker, float* out,
                                           float* lse, const lattice::bf16* qkv16, int64_t width,
                                           int64_t k_column, int64_t v_column,
                                           const kernels::AttentionShape& local) {
  const Tensor wide = widened(ops, tracker, qkv16, packed_rows(local), width);
  const float* qkv = wide.f32();
  forward(ops, out, lse, qkv, qkv + k_column, qkv + v_column, local, kernels::Precision::bf16);
}

void ContextAttention::backward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker,
                                            lattice::bf16* d_qkv16, float* column_sums,
                                            const float* d_out, const lattice::bf16* qkv16,
                                            int64_t width, int64_t k_column, int64_t v_column,
                                            const float* out, const float* lse,
                                            const kernels::AttentionShape& local) {
  const int64_t rows = packed_rows(local);
  const Tensor wide = widened(ops, tracker, qkv16, rows, width);
  Tensor d_wide({rows, width}, DType::f32, ops.memory(), tracker, MemoryCategory::activations);
  const float* qkv = wide.f32();
  float* d = d_wide.f32();
  backward(ops, d, d + k_column, d + v_column, d_out, qkv, qkv + k_column, qkv + v_column, out, lse,
           local, kernels::Precision::bf16);
  ops.round_with_column_sums(d_qkv16, column_sums, d, rows, width);
}

void rope_at_runs(kernels::Ops& ops, const ContextAttention* context,
                  const kernels::RopeTable& table, float* x, int64_t batch, int64_t local_len,
                  int64_t heads, int64_t row_stride, int64_t batch_stride, bool inverse) {
  if (context == nullptr) {
    ops.rope(table, x, batch, local_len, heads, row_stride, batch_stride, 0, inverse);
    return;
  }
  for (const PositionRun& run : context->runs(local_len))
    ops.rope(table, x + run.row * row_stride, batch, run.length, heads, row_stride, batch_stride,
             run.position, inverse);
}

}  // namespace lattice::model
