// Bulk fp32 <-> bf16 conversion (round-to-nearest-even), vectorised and threaded.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// Bit-identical to lattice::to_bf16 / to_float for every input (NaN stays a quiet NaN, denormals
// are rounded, not flushed). Threaded over the calling thread's OpenMP team for large n.
void convert_to_bf16(bf16* out, const float* in, int64_t n);
void convert_to_f32(float* out, const bf16* in, int64_t n);
// convert_to_bf16 on the calling thread only (no OpenMP region), for short runs inside a caller's
// own parallel loop.
void convert_to_bf16_on_this_thread(bf16* out, const float* in, int64_t n);
// convert_to_f32 on the calling thread only.
void convert_to_f32_on_this_thread(float* out, const bf16* in, int64_t n);
// out[i] = to_bf16(in[i] * scale) (the fp32 product, then rounded), on the calling thread: a
// scaling pass and a rounding pass in one.
void convert_scaled_to_bf16_on_this_thread(bf16* out, const float* in, float scale, int64_t n);

// Strided form: rows x cols fp32 values whose rows start in_row_stride floats apart are written
// densely (out row r at out + r * cols). Used to pack GEMM operands with leading dimensions.
void convert_rows_to_bf16(bf16* out, const float* in, int64_t rows, int64_t cols,
                          int64_t in_row_stride);

}  // namespace lattice::kernels
