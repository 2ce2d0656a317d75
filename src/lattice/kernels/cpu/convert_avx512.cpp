// The AVX-512 serial converters (convert_isa.hpp): 16 lanes at a time with bf16_vector.hpp's
// to_bf16_bits, the tail element by element with lattice::to_bf16. Compiled with the AVX-512
// flags (CMakeLists.txt) and again, as the avx512bf16 tier, by convert_avx512bf16.cpp, where
// to_bf16_bits uses vcvtneps2bf16 where no lane is denormal.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/convert_isa.hpp"

#if !defined(LATTICE_CONVERT_TIER)
#define LATTICE_CONVERT_TIER avx512
#endif

namespace lattice::kernels::LATTICE_CONVERT_TIER {
namespace {

using u32x16 = uint32_t __attribute__((vector_size(64)));
using u16x16 = uint16_t __attribute__((vector_size(32)));

template <bool Scaled>
void to_bf16_serial_impl(bf16* out, const float* in, int64_t n, float scale) {
  int64_t i = 0;
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if constexpr (Scaled) x = _mm512_mul_ps(x, scale_v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_bits(x));
  }
  for (; i < n; ++i) out[i] = to_bf16(Scaled ? in[i] * scale : in[i]);
}

void to_bf16_serial(bf16* out, const float* in, int64_t n) {
  to_bf16_serial_impl<false>(out, in, n, 1.0f);
}

void to_bf16_scaled_serial(bf16* out, const float* in, int64_t n, float scale) {
  to_bf16_serial_impl<true>(out, in, n, scale);
}

void to_f32_serial(float* out, const bf16* in, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    u16x16 h;
    std::memcpy(&h, in + i, sizeof h);
    const u32x16 u = __builtin_convertvector(h, u32x16) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
  for (; i < n; ++i) out[i] = to_float(in[i]);
}

}  // namespace

const SerialConverters& converters() {
  static constexpr SerialConverters kConverters{to_bf16_serial, to_bf16_scaled_serial,
                                                to_f32_serial};
  return kConverters;
}

}  // namespace lattice::kernels::LATTICE_CONVERT_TIER
