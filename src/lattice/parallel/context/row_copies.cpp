// Row copies for the context-parallel attentions: see row_copies.hpp.
#include "lattice/parallel/context/row_copies.hpp"

namespace lattice::parallel {

float* ContextWorkspace::slot(size_t index, int64_t n) {
  if (slots_.size() <= index) slots_.resize(index + 1);
  Tensor& t = slots_[index];
  if (t.numel() < n) t = Tensor({n}, DType::f32, memory_, tracker_, MemoryCategory::activations);
  return t.f32();
}

int64_t ContextWorkspace::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : slots_) total += t.numel() * 4;
  return total;
}

namespace {

constexpr size_t kFloat = sizeof(float);

size_t bytes_of(int64_t floats) {
  return static_cast<size_t>(floats) * kFloat;
}

}  // namespace

void copy_rows(DeviceMemory& memory, float* dst, int64_t dst_row_stride, int64_t dst_batch_stride,
               const float* src, int64_t src_row_stride, int64_t src_batch_stride, int64_t batch,
               int64_t len, int64_t width) {
  if (len <= 0 || width <= 0) return;
  for (int64_t b = 0; b < batch; ++b)
    memory.copy_rows(dst + b * dst_batch_stride, bytes_of(dst_row_stride),
                     src + b * src_batch_stride, bytes_of(src_row_stride), bytes_of(width),
                     static_cast<size_t>(len), CopyKind::device_to_device);
}

void pack_rows(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t row,
               int64_t len, int64_t width, int64_t row_stride, int64_t batch_stride) {
  copy_rows(memory, dst, width, len * width, src + row * row_stride, row_stride, batch_stride,
            batch, len, width);
}

void unpack_rows(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t row,
                 int64_t len, int64_t width, int64_t row_stride, int64_t batch_stride) {
  copy_rows(memory, dst + row * row_stride, row_stride, batch_stride, src, width, len * width,
            batch, len, width);
}

void pack_columns(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t heads,
                  int64_t n, int64_t col, int64_t len) {
  if (len <= 0) return;
  memory.copy_rows(dst, bytes_of(len), src + col, bytes_of(n), bytes_of(len),
                   static_cast<size_t>(batch * heads), CopyKind::device_to_device);
}

void unpack_columns(DeviceMemory& memory, float* dst, const float* src, int64_t batch,
                    int64_t heads, int64_t n, int64_t col, int64_t len) {
  if (len <= 0) return;
  memory.copy_rows(dst + col, bytes_of(n), src, bytes_of(len), bytes_of(len),
                   static_cast<size_t>(batch * heads), CopyKind::device_to_device);
}

}  // namespace lattice::parallel
