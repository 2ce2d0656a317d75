// Branch-free fp32 exp for vectorised loops: std::exp does not auto-vectorise without -ffast-math,
// this does (under `#pragma omp simd`), to about 1 ulp of the exact result over its working range.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lattice::kernels {

// e^x for x in [-87, 88] (relative error below 1.5e-7, about 1 ulp); inputs below -87 give 0 and
// inputs above 88 give e^88 (finite, so 1 + fast_exp(x) never overflows); NaN gives NaN.
inline float fast_exp(float x) {
  constexpr float kLowest = -87.0f;  // e^-87 = 1.6e-38, still a normal float
  constexpr float kHighest = 88.0f;  // e^88 = 1.65e38 < FLT_MAX
  constexpr float kLog2e = 1.44269504088896341f;
  // ln 2 split in a part with few mantissa bits (exact products with n) and the remainder
  // (Cody-Waite).
  constexpr float kLn2High = 0.693359375f;
  constexpr float kLn2Low = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds to the nearest integer and leaves that integer in the low mantissa
  // bits.
  constexpr float kRoundingShift = 12582912.0f;

  const bool underflows = x < kLowest;
  float clamped = x < kLowest ? kLowest : x;
  clamped = clamped > kHighest ? kHighest : clamped;
  const float shifted = std::fma(clamped, kLog2e, kRoundingShift);
  const int32_t n = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundingShift);
  const float n_float = shifted - kRoundingShift;
  float r = std::fma(n_float, -kLn2High, clamped);
  r = std::fma(n_float, -kLn2Low, r);  // |r| <= ln2 / 2
  // Minimax polynomial for (e^r - 1 - r) / r^2 on [-ln2/2, ln2/2] (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float e_r = std::fma(p, r * r, r) + 1.0f;
  const float two_to_n = std::bit_cast<float>((n + 127) << 23);  // n in [-126, 127]: a normal float
  const float result = e_r * two_to_n;
  return underflows ? 0.0f : result;
}

#if defined(__AVX512F__)
// e^r on 16 lanes for |r| <= ln2/2: fast_exp's polynomial, operation for operation (also the
// vocabulary-blocked head's exponential).
inline __m512 fast_exp_of_reduced(__m512 r) {
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  return _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
}

// fast_exp on 16 lanes, bit for bit: the same operations in the same order (each FMA an FMA, each
// product and sum rounded alone), with the clamps as max/min whose operand order keeps a NaN lane
// NaN as the scalar comparisons do. (Zero-masked forms with every lane selected: GCC 12 warns,
// falsely, on the unmasked forms' undefined pass-through operand.)
inline __m512 fast_exp(__m512 x) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512 lowest = _mm512_set1_ps(-87.0f), highest = _mm512_set1_ps(88.0f);
  const __m512 rounding_shift = _mm512_set1_ps(12582912.0f);
  const __mmask16 underflows = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
  const __m512 clamped = _mm512_maskz_min_ps(kAll, highest, _mm512_maskz_max_ps(kAll, lowest, x));
  const __m512 shifted =
      _mm512_fmadd_ps(clamped, _mm512_set1_ps(1.44269504088896341f), rounding_shift);
  const __m512i n =
      _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_castps_si512(rounding_shift));
  const __m512 n_float = _mm512_sub_ps(shifted, rounding_shift);
  __m512 r = _mm512_fmadd_ps(n_float, _mm512_set1_ps(-0.693359375f), clamped);
  r = _mm512_fmadd_ps(n_float, _mm512_set1_ps(2.12194440e-4f), r);
  const __m512 e_r = fast_exp_of_reduced(r);
  const __m512 two_to_n = _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAll, _mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflows), _mm512_mul_ps(e_r, two_to_n));
}
#endif

}  // namespace lattice::kernels
