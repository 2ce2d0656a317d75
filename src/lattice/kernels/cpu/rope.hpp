// Rotary position embedding with the half rotation of Hugging Face (rotate_half), applied in place
// on the CPU from a RopeTable.
#pragma once

#include <cstdint>

#include "lattice/kernels/rope_table.hpp"

namespace lattice::kernels {

// x holds [batch, seq, heads, head_dim] with `row_stride` elements between consecutive tokens and
// `batch_stride` between batches; token t has position pos_offset + t. For each pair i < D/2:
//   x'[i] = x[i] cos - x[i+D/2] sin,  x'[i+D/2] = x[i+D/2] cos + x[i] sin.
// inverse = true rotates by the negative angle, which is the backward of the forward rotation.
void rope_apply(const RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
                int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse);

}  // namespace lattice::kernels
