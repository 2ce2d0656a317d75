// The AVX-512 parts of the reduction kernels (reduce_kernels_avx512.cpp, compiled for AVX-512:
// CMakeLists.txt), private to comm; reduce_kernels.cpp calls them where cpu_features() has
// AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lattice::comm {

// Elements per block of the reduction kernels (their L1 staging buffer).
inline constexpr int64_t kBlock = 2048;

namespace avx512 {
// `bytes` from `source` to `target` with non-temporal stores where `target` is 64-byte aligned
// (the unaligned head and the tail copied plainly).
void stream_block(void* target, const void* source, size_t bytes);
// fp32 sums (and averages when average_divisor > 0) of at most kBlock elements, straight from the
// sources into the targets: the same additions in the same order as the blocked kernel.
void sum_f32_block(const void* const* sources, int source_count, void* const* targets,
                   int target_count, int64_t count, int average_divisor);
}  // namespace avx512

}  // namespace lattice::comm
