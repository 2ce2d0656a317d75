// What the context-parallel attentions share: the workspace they reuse from call to call, and row
// copies — strided token rows in and out of contiguous blocks, one run's rows of an attention
// output or log-sum-exp — each one DeviceMemory::copy_rows per sequence (or one in all) in the
// backend's memory.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/context_parallel.hpp"

namespace lattice::parallel {

// fp32 buffers by slot in `memory` (the backend's), each grown to the largest request and kept
// (counted in the tracker as activations while it lives): fresh buffers per call cost more in
// page faults than the copies themselves. Contents are unspecified; a caller writes before it
// reads.
class ContextWorkspace {
 public:
  ContextWorkspace(DeviceMemory& memory, MemoryTracker* tracker)
      : memory_(memory), tracker_(tracker) {}
  float* slot(size_t index, int64_t n);
  // The bytes held (every slot at its largest request so far).
  int64_t bytes() const;
  DeviceMemory& memory() const { return memory_; }

 private:
  DeviceMemory& memory_;
  MemoryTracker* tracker_;
  std::vector<Tensor> slots_;
};

// Token rows of `width` floats from src to dst, each with its own row and batch strides.
void copy_rows(DeviceMemory& memory, float* dst, int64_t dst_row_stride, int64_t dst_batch_stride,
               const float* src, int64_t src_row_stride, int64_t src_batch_stride, int64_t batch,
               int64_t len, int64_t width);

// dst [batch, len, width] contiguous = rows [row, row + len) of src (row_stride, batch_stride
// between tokens and sequences); unpack_rows is the inverse.
void pack_rows(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t row,
               int64_t len, int64_t width, int64_t row_stride, int64_t batch_stride);
void unpack_rows(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t row,
                 int64_t len, int64_t width, int64_t row_stride, int64_t batch_stride);

// Per-head statistics laid out [batch, heads, n] (log-sum-exp): dst [batch, heads, len] = columns
// [col, col + len) of src; unpack_columns the inverse.
void pack_columns(DeviceMemory& memory, float* dst, const float* src, int64_t batch, int64_t heads,
                  int64_t n, int64_t col, int64_t len);
void unpack_columns(DeviceMemory& memory, float* dst, const float* src, int64_t batch,
                    int64_t heads, int64_t n, int64_t col, int64_t len);

}  // namespace lattice::parallel
