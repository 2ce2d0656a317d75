// The per-chunk sum of squares of each instruction-set tier, private to kernels/cpu: reduce.cpp's
// portable loop and reduce_avx512.cpp's (chosen where cpu_features() has AVX-512). The tiers add
// in different orders, so their bits differ; a given CPU always takes the same one.
#pragma once

#include <cstdint>

namespace lattice::kernels {

double portable_chunk_sum_of_squares(const float* x, int64_t n);
namespace avx512 {
double chunk_sum_of_squares(const float* x, int64_t n);
}

}  // namespace lattice::kernels
