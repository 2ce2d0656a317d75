// Row copies for the context-parallel attentions: see row_copies.hpp.
#include "lattice/parallel/context/row_copies.hpp"

#include <algorithm>

namespace lattice::parallel {

float* ContextWorkspace::slot(size_t index, int64_t n) {
  if (slots_.size() <= index) slots_.resize(index + 1);
  Tensor& t = slots_[index];
  if (t.numel() < n) t = Tensor({n}, DType::f32, tracker_, MemoryCategory::activations);
  return t.f32();
}

int64_t ContextWorkspace::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : slots_) total += t.numel() * 4;
  return total;
}

void copy_rows(float* dst, int64_t dst_row_stride, int64_t dst_batch_stride, const float* src,
               int64_t src_row_stride, int64_t src_batch_stride, int64_t batch, int64_t len,
               int64_t width) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < len; ++t)
      std::copy_n(src + b * src_batch_stride + t * src_row_stride, width,
                  dst + b * dst_batch_stride + t * dst_row_stride);
}

void pack_rows(float* dst, const float* src, int64_t batch, int64_t row, int64_t len, int64_t width,
               int64_t row_stride, int64_t batch_stride) {
  copy_rows(dst, width, len * width, src + row * row_stride, row_stride, batch_stride, batch, len,
            width);
}

void unpack_rows(float* dst, const float* src, int64_t batch, int64_t row, int64_t len,
                 int64_t width, int64_t row_stride, int64_t batch_stride) {
  copy_rows(dst + row * row_stride, row_stride, batch_stride, src, width, len * width, batch, len,
            width);
}

void pack_columns(float* dst, const float* src, int64_t batch, int64_t heads, int64_t n,
                  int64_t col, int64_t len) {
  for (int64_t bh = 0; bh < batch * heads; ++bh)
    std::copy_n(src + bh * n + col, len, dst + bh * len);
}

void unpack_columns(float* dst, const float* src, int64_t batch, int64_t heads, int64_t n,
                    int64_t col, int64_t len) {
  for (int64_t bh = 0; bh < batch * heads; ++bh)
    std::copy_n(src + bh * len, len, dst + bh * n + col);
}

}  // namespace lattice::parallel
