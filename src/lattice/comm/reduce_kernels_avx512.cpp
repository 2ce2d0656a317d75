// The reduction kernels' AVX-512 parts (reduce_kernels_isa.hpp), compiled with the AVX-512 flags
// (CMakeLists.txt).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "lattice/comm/reduce_kernels_isa.hpp"

namespace lattice::comm::avx512 {
namespace {

// fp32 sums (and averages) of at most one block, straight from the sources into the targets, 16
// lanes at a time: the same additions in the same order as reduce_typed (source 0 + source 1 + ...,
// then the division), so the same bits, without the staging block and its copy: 128 floats from
// two sources (a 1 KiB reduce-scatter's share on 2 ranks) 47-50 -> 14 ns, best of 20,000 loops.
// Every source of a lane is loaded before any target is stored, which keeps a target that aliases
// a source element for element correct.
template <int kSources>  // 0: any number, given by source_count
void sum_f32_block_of(const void* const* sources, int source_count, void* const* targets,
                      int target_count, int64_t count, int average_divisor) {
  if constexpr (kSources > 0) source_count = kSources;
  const __m512 divisor = _mm512_set1_ps(static_cast<float>(average_divisor));
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes =
        count - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (count - i)) - 1);
    __m512 acc = _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(sources[0]) + i);
    for (int s = 1; s < source_count; ++s)
      acc = _mm512_add_ps(acc,
                          _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(sources[s]) + i));
    if (average_divisor > 0) acc = _mm512_div_ps(acc, divisor);
    for (int t = 0; t < target_count; ++t)
      _mm512_mask_storeu_ps(static_cast<float*>(targets[t]) + i, lanes, acc);
  }
}

}  // namespace

void sum_f32_block(const void* const* sources, int source_count, void* const* targets,
                   int target_count, int64_t count, int average_divisor) {
  if (source_count == 2 && target_count == 1)  // a reduce-scatter or reduce on two ranks
    return sum_f32_block_of<2>(sources, 2, targets, 1, count, average_divisor);
  sum_f32_block_of<0>(sources, source_count, targets, target_count, count, average_divisor);
}

void stream_block(void* target, const void* source, size_t bytes) {
  auto* out = static_cast<char*>(target);
  const auto* in = static_cast<const char*>(source);
  size_t head = (64 - (reinterpret_cast<uintptr_t>(out) & 63)) & 63;
  std::memcpy(out, in, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    __m512i v = _mm512_loadu_si512(in + i);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i), v);
  }
  std::memcpy(out + i, in + i, bytes - i);
}

}  // namespace lattice::comm::avx512
