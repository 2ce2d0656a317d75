// Bulk fp32 <-> bf16 conversion (round-to-nearest-even), vectorised and threaded.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

void convert_to_bf16(bf16* out, const float* in, int64_t n);
void convert_to_f32(float* out, const bf16* in, int64_t n);

}  // namespace lattice::kernels
