// attention_forward_bf16 / attention_backward_bf16: attention on q, k, v that are bf16 already.
// On AMX the tile kernels read the bf16 rows as they are; elsewhere the rows are widened to dense
// fp32, run through the portable bf16 path (same rounding, so the same bits as on the fp32
// inputs they round from) and the gradients narrowed back to bf16 rows with column sums.
#include <algorithm>
#include <cstdint>
#include <memory>

#include <omp.h>

#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/attention_paths.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/thread_columns.hpp"

namespace lattice::kernels {

namespace {

// Dense fp32 copies of bf16 rows (the portable path of the bf16-input entry points): `rows` token
// rows of `width` elements at `src` (row stride src_stride, batch stride src_batch) for each batch,
// in storage left uninitialised (every element is written), the rows spread over the threads.
// Dense rows are `dense_stride` apart (at least width; the elements past width are not written).
std::unique_ptr<float[]> widen_rows(const lattice::bf16* src, int64_t batches, int64_t rows,
                                    int64_t width, int64_t src_stride, int64_t src_batch,
                                    int64_t dense_stride) {
  auto dense =
      std::make_unique_for_overwrite<float[]>(static_cast<size_t>(batches * rows * dense_stride));
  const int64_t total = batches * rows;
#pragma omp parallel for schedule(static) if (total * width >= (1 << 15))
  for (int64_t r = 0; r < total; ++r) {
    convert_to_f32_on_this_thread(dense.get() + r * dense_stride,
                                  src + (r / rows) * src_batch + (r % rows) * src_stride, width);
  }
  return dense;
}
std::unique_ptr<float[]> widen_rows(const lattice::bf16* src, int64_t batches, int64_t rows,
                                    int64_t width, int64_t src_stride, int64_t src_batch) {
  return widen_rows(src, batches, rows, width, src_stride, src_batch, width);
}

// The dense fp32 gradient [batches, rows, width] rounded into strided bf16 rows, with each batch's
// column sums (double, token order) when sums is not null: each thread rounds and sums its own
// columns of every row (thread_columns), so every column is still summed row by row and the
// results do not depend on the thread count.
void narrow_rows(lattice::bf16* dst, double* sums, int64_t sums_batch_stride, const float* dense,
                 int64_t batches, int64_t rows, int64_t width, int64_t dst_stride,
                 int64_t dst_batch, int64_t dense_stride) {
#pragma omp parallel if (batches * rows * width >= (1 << 15))
  {
    const ColumnRange range = thread_columns(width, omp_get_thread_num(), omp_get_num_threads());
    for (int64_t b = 0; b < batches && range.width() > 0; ++b) {
      double* batch_sums = sums != nullptr ? sums + b * sums_batch_stride : nullptr;
      if (batch_sums != nullptr) std::fill(batch_sums + range.begin, batch_sums + range.end, 0.0);
      for (int64_t t = 0; t < rows; ++t) {
        const float* row = dense + (b * rows + t) * dense_stride;
        convert_to_bf16_on_this_thread(dst + b * dst_batch + t * dst_stride + range.begin,
                                       row + range.begin, range.width());
        if (batch_sums == nullptr) continue;
        for (int64_t j = range.begin; j < range.end; ++j)
          batch_sums[j] += static_cast<double>(row[j]);
      }
    }
  }
}

// The row stride of the dense k and v copies: one stride for both (they share kv_batch_stride),
// wide enough for the wider of a key row and a value row.
int64_t dense_kv_stride(const AttentionShape& s) {
  return s.kv_heads * std::max(s.head_dim, s.value_dim());
}

// The shape of dense copies of the rows `s` describes: same lengths, heads, widths, positions,
// mask and window.
AttentionShape dense_shape(const AttentionShape& s) {
  AttentionShape dense =
      AttentionShape::contiguous(s.batch, s.q_len, s.kv_len, s.q_heads, s.kv_heads, s.head_dim);
  dense.q_offset = s.q_offset;
  dense.k_offset = s.k_offset;
  dense.mask = s.mask;
  dense.window = s.window;
  dense.v_head_dim = s.v_head_dim;
  dense.k_row_stride = dense.v_row_stride = dense_kv_stride(s);
  dense.kv_batch_stride = s.kv_len * dense.k_row_stride;
  return dense;
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q, const lattice::bf16* k,
                            const lattice::bf16* v, const AttentionShape& shape,
                            const AttentionOptions& options) {
  attention_detail::validate(shape, "attention_forward_bf16");
  if (attention_detail::use_amx(options, shape)) {
    attention_detail::attention_forward_amx(out, lse, q, k, v, shape);
    return;
  }
  const AttentionShape& s = shape;
  const auto q32 =
      widen_rows(q, s.batch, s.q_len, s.q_heads * s.head_dim, s.q_row_stride, s.q_batch_stride);
  const int64_t kv_stride = dense_kv_stride(s);
  const auto k32 = widen_rows(k, s.batch, s.kv_len, s.kv_heads * s.head_dim, s.k_row_stride,
                              s.kv_batch_stride, kv_stride);
  const auto v32 = widen_rows(v, s.batch, s.kv_len, s.kv_heads * s.value_dim(), s.v_row_stride,
                              s.value_batch_stride(), kv_stride);
  const AttentionShape dense = dense_shape(s);
  MatmulEngine unused;
  attention_forward(out, lse, q32.get(), k32.get(), v32.get(), dense, Precision::bf16, unused,
                    options);
}

void attention_backward_bf16(const AttentionGradientsBf16& grads, const float* d_out,
                             const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                             const float* out, const float* lse, const AttentionShape& shape,
                             const AttentionOptions& options) {
  attention_detail::validate(shape, "attention_backward_bf16");
  check(!options.accumulate_dq,
        "attention_backward_bf16: accumulate_dq is not supported (dq is rounded to bf16 per call); "
        "sum block gradients in fp32 with attention_backward and Precision::bf16");
  const bool sums = grads.dq_sums != nullptr;
  check(sums == (grads.dk_sums != nullptr) && sums == (grads.dv_sums != nullptr),
        "attention_backward_bf16: give all three column-sum arrays (dq, dk, dv) or none");
  if (attention_detail::use_amx(options, shape)) {
    attention_detail::attention_backward_amx(grads, d_out, q, k, v, out, lse, shape);
    return;
  }
  const AttentionShape& s = shape;
  const int64_t Tq = s.q_len, Tk = s.kv_len;
  const int64_t q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const int64_t v_width = s.kv_heads * s.value_dim();
  const int64_t kv_stride = dense_kv_stride(s);
  const auto q32 = widen_rows(q, s.batch, Tq, q_width, s.q_row_stride, s.q_batch_stride);
  const auto k32 =
      widen_rows(k, s.batch, Tk, kv_width, s.k_row_stride, s.kv_batch_stride, kv_stride);
  const auto v32 =
      widen_rows(v, s.batch, Tk, v_width, s.v_row_stride, s.value_batch_stride(), kv_stride);
  // Overwritten by attention_backward (the columns past a row's width are never read): no fill.
  auto dq32 = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * Tq * q_width));
  auto dk32 =
      std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * Tk * kv_stride));
  auto dv32 =
      std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * Tk * kv_stride));
  const AttentionShape dense = dense_shape(s);
  MatmulEngine unused;
  attention_backward(dq32.get(), dk32.get(), dv32.get(), d_out, q32.get(), k32.get(), v32.get(),
                     out, lse, dense, Precision::bf16, unused, options);
  narrow_rows(grads.dq, grads.dq_sums, grads.sums_batch_stride, dq32.get(), s.batch, Tq, q_width,
              s.q_row_stride, s.q_batch_stride, q_width);
  narrow_rows(grads.dk, grads.dk_sums, grads.sums_batch_stride, dk32.get(), s.batch, Tk, kv_width,
              s.k_row_stride, s.kv_batch_stride, kv_stride);
  narrow_rows(grads.dv, grads.dv_sums, grads.sums_batch_stride, dv32.get(), s.batch, Tk, v_width,
              s.v_row_stride, s.value_batch_stride(), kv_stride);
}
}  // namespace lattice::kernels
