// The GELU's AVX-512 bf16 vector loops (activations_isa.hpp), compiled with the AVX-512 flags
// (CMakeLists.txt) and again, as the avx512bf16 tier, by activations_avx512bf16.cpp (its
// to_bf16_bits then uses vcvtneps2bf16).
#include <immintrin.h>

#include <cstdint>

#include "lattice/kernels/cpu/activations_isa.hpp"
#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"

#if !defined(LATTICE_ACTIVATIONS_TIER)
#define LATTICE_ACTIVATIONS_TIER avx512
#endif

namespace lattice::kernels::LATTICE_ACTIVATIONS_TIER {
namespace {

// gelu_value_and_slope on 16 lanes, the same operations in the same order (bit for bit), both
// results rounded to bf16 in registers.
inline void gelu_value_and_slope_bf16(lattice::bf16* value, lattice::bf16* slope, __m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f), sqrt2_over_pi = _mm512_set1_ps(kSqrt2OverPi);
  const __m512 x_squared = _mm512_mul_ps(x, x);
  const __m512 u = _mm512_mul_ps(
      sqrt2_over_pi,
      _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluCubic), x_squared), x)));
  const __m512 du_dx = _mm512_mul_ps(
      sqrt2_over_pi,
      _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(3.0f * kGeluCubic), x_squared)));
  const __m512 e = fast_exp(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
  const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
  const __m512 one_minus_s = _mm512_mul_ps(e, s);
  const __m512 two_x_s = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), x), s);
  const __m512 slope_value =
      _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(two_x_s, one_minus_s), du_dx));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(value), to_bf16_bits(_mm512_mul_ps(x, s)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(slope), to_bf16_bits(slope_value));
}

int64_t gelu_forward_bf16_with_slope(lattice::bf16* out, lattice::bf16* slope, const float* in,
                                     int64_t n) {
  const int64_t vector_end = n / 16 * 16;
  for (int64_t i = 0; i < vector_end; i += 16)
    gelu_value_and_slope_bf16(out + i, slope + i, _mm512_loadu_ps(in + i));
  return vector_end;
}

// 16 columns at a time in registers: the product rounded, its column sums accumulated in the same
// order (row by row, in double) as activations.cpp's loop.
int64_t gelu_backward_from_slope_bf16_row(lattice::bf16* d_in16, double* column_sums,
                                          const float* d_out, const lattice::bf16* slope,
                                          int64_t cols) {
  const int64_t vector_end = cols / 16 * 16;
  for (int64_t j = 0; j < vector_end; j += 16) {
    // (Zero-masked forms with every lane selected: GCC 12 warns, falsely, on the unmasked forms'
    // undefined pass-through operand.)
    const __m512i slope_bits = _mm512_maskz_cvtepu16_epi32(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slope + j)));
    const __m512 product =
        _mm512_mul_ps(_mm512_loadu_ps(d_out + j),
                      _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, slope_bits, 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d_in16 + j), to_bf16_bits(product));
    if (column_sums != nullptr) {
      double* sum = column_sums + j;
      const __m256 low = _mm512_maskz_extractf32x8_ps(0xff, product, 0);
      const __m256 high = _mm512_maskz_extractf32x8_ps(0xff, product, 1);
      _mm512_storeu_pd(sum, _mm512_add_pd(_mm512_loadu_pd(sum), _mm512_maskz_cvtps_pd(0xff, low)));
      _mm512_storeu_pd(sum + 8,
                       _mm512_add_pd(_mm512_loadu_pd(sum + 8), _mm512_maskz_cvtps_pd(0xff, high)));
    }
  }
  return vector_end;
}

}  // namespace

const ActivationVectors& activation_vectors() {
  static constexpr ActivationVectors kVectors{gelu_forward_bf16_with_slope,
                                              gelu_backward_from_slope_bf16_row};
  return kVectors;
}

}  // namespace lattice::kernels::LATTICE_ACTIVATIONS_TIER
