// fp32 <-> bf16 bulk conversion: see convert.hpp. The AVX-512 path does the same integer arithmetic
// as lattice::to_bf16 (add 0x7fff + lsb, shift, quiet NaNs). With AVX512_BF16, vcvtneps2bf16 does
// the conversion in one instruction: it rounds to nearest even and quiets NaNs exactly as to_bf16,
// but treats denormal inputs as zero, so a vector holding a denormal is redone with the integer
// arithmetic (a test per vector; denormals are rare in training data).
#include "lattice/kernels/cpu/convert.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

namespace lattice::kernels {
namespace {

// Elements per parallel work item: large enough to amortise scheduling, small enough to split work.
constexpr int64_t kChunk = 1 << 16;

#if defined(__AVX512F__)
using u32x16 = uint32_t __attribute__((vector_size(64)));
using u16x16 = uint16_t __attribute__((vector_size(32)));

// lattice::to_bf16 on 16 lanes in integer arithmetic: add 0x7fff + lsb and shift; NaNs are quieted.
// Vector extensions rather than the unmasked shift and narrowing intrinsics, on whose undefined
// pass-through operands GCC 12 warns (falsely).
inline __m256i to_bf16_bits(__m512i bits) {
  const u32x16 u = std::bit_cast<u32x16>(bits);
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const u32x16 nan_bits = (u >> 16) | 0x0040u;
  const u32x16 is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  const u32x16 chosen = is_nan ? nan_bits : rounded;
  return std::bit_cast<__m256i>(__builtin_convertvector(chosen, u16x16));
}
#endif

// out[i] = to_bf16(in[i]) or, with Scaled, to_bf16(in[i] * scale) (one fp32 multiply).
template <bool Scaled>
void to_bf16_serial_impl(bf16* out, const float* in, int64_t n, float scale) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  const __m512i exponent_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if constexpr (Scaled) x = _mm512_mul_ps(x, scale_v);
    const __m512i u = _mm512_castps_si512(x);
    // Denormal lanes: exponent bits all zero, magnitude not zero.
    const __mmask16 denormal =
        _mm512_testn_epi32_mask(u, exponent_mask) & _mm512_test_epi32_mask(u, abs_mask);
    const __m256i bits =
        denormal == 0 ? std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x)) : to_bf16_bits(u);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bits);
  }
#elif defined(__AVX512F__)
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if constexpr (Scaled) x = _mm512_mul_ps(x, scale_v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_bits(_mm512_castps_si512(x)));
  }
#endif
  for (; i < n; ++i) out[i] = to_bf16(Scaled ? in[i] * scale : in[i]);
}

void to_bf16_serial(bf16* out, const float* in, int64_t n) {
  to_bf16_serial_impl<false>(out, in, n, 1.0f);
}

void to_f32_serial(float* out, const bf16* in, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    u16x16 h;
    std::memcpy(&h, in + i, sizeof h);
    const u32x16 u = __builtin_convertvector(h, u32x16) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
#endif
  for (; i < n; ++i) out[i] = to_float(in[i]);
}

}  // namespace

void convert_to_bf16(bf16* out, const float* in, int64_t n) {
  if (n <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    to_bf16_serial(out + begin, in + begin, std::min(kChunk, n - begin));
  }
}

void convert_to_bf16_on_this_thread(bf16* out, const float* in, int64_t n) {
  if (n > 0) to_bf16_serial(out, in, n);
}

void convert_scaled_to_bf16_on_this_thread(bf16* out, const float* in, float scale, int64_t n) {
  if (n > 0) to_bf16_serial_impl<true>(out, in, n, scale);
}

void convert_to_f32(float* out, const bf16* in, int64_t n) {
  if (n <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    to_f32_serial(out + begin, in + begin, std::min(kChunk, n - begin));
  }
}

void convert_rows_to_bf16(bf16* out, const float* in, int64_t rows, int64_t cols,
                          int64_t in_row_stride) {
  if (rows <= 0 || cols <= 0) return;
  if (in_row_stride == cols) return convert_to_bf16(out, in, rows * cols);
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
  for (int64_t r = 0; r < rows; ++r) to_bf16_serial(out + r * cols, in + r * in_row_stride, cols);
}

}  // namespace lattice::kernels
