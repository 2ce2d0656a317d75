// fp32 <-> bf16 bulk conversion: see convert.hpp. The AVX-512 path rounds 16 lanes at a time with
// bf16_vector.hpp's to_bf16_bits (vcvtneps2bf16 where no lane is denormal, else the integer
// arithmetic of lattice::to_bf16), the tail element by element with lattice::to_bf16.
#include "lattice/kernels/cpu/convert.hpp"

#include "lattice/kernels/cpu/bf16_vector.hpp"

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
#endif

// out[i] = to_bf16(in[i]) or, with Scaled, to_bf16(in[i] * scale) (one fp32 multiply).
template <bool Scaled>
void to_bf16_serial_impl(bf16* out, const float* in, int64_t n, float scale) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if constexpr (Scaled) x = _mm512_mul_ps(x, scale_v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_bits(x));
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

void convert_to_f32_on_this_thread(float* out, const bf16* in, int64_t n) {
  if (n > 0) to_f32_serial(out, in, n);
}

void convert_rows_to_bf16(bf16* out, const float* in, int64_t rows, int64_t cols,
                          int64_t in_row_stride) {
  if (rows <= 0 || cols <= 0) return;
  if (in_row_stride == cols) return convert_to_bf16(out, in, rows * cols);
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
  for (int64_t r = 0; r < rows; ++r) to_bf16_serial(out + r * cols, in + r * in_row_stride, cols);
}

}  // namespace lattice::kernels
