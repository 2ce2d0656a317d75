// fp32 -> bf16 rounding of 16 lanes at once, bit-identical to lattice::to_bf16 (round to nearest
// even, NaNs quieted, denormals rounded, not flushed): the conversion of the bulk converters and of
// kernels that round their results while they are still in registers.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lattice::kernels {

#if defined(__AVX512F__)
using bf16_lanes_f32 = float __attribute__((vector_size(64)));
using bf16_lanes_u32 = uint32_t __attribute__((vector_size(64)));
using bf16_lanes_u16 = uint16_t __attribute__((vector_size(32)));

// lattice::to_bf16 on 16 lanes in integer arithmetic: add 0x7fff + lsb and shift; NaNs are quieted.
// Vector extensions rather than the unmasked shift and narrowing intrinsics, on whose undefined
// pass-through operands GCC 12 warns (falsely).
inline __m256i to_bf16_bits_by_integers(__m512i bits) {
  const auto u = std::bit_cast<bf16_lanes_u32>(bits);
  const bf16_lanes_u32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bf16_lanes_u32 nan_bits = (u >> 16) | 0x0040u;
  const bf16_lanes_u32 is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  const bf16_lanes_u32 chosen = is_nan ? nan_bits : rounded;
  return std::bit_cast<__m256i>(__builtin_convertvector(chosen, bf16_lanes_u16));
}

// lattice::to_bf16 on 16 lanes. With AVX512_BF16, vcvtneps2bf16 rounds to nearest even and quiets
// NaNs exactly as to_bf16 but treats denormal inputs as zero, so a vector holding a denormal is
// done with the integer arithmetic instead (a test per vector; denormals are rare).
inline __m256i to_bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
#if defined(__AVX512BF16__)
  const __mmask16 denormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                             _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffffff));
  if (denormal == 0) return std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
#endif
  return to_bf16_bits_by_integers(u);
}
#endif

}  // namespace lattice::kernels
