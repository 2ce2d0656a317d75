// Register shuffles of the AMX kernels (GCC/Clang vector extensions, one zmm per 64-byte vector
// under AVX-512): two rows of bf16 interleaved into pairs (the layout tdpbf16ps reads), a 16 x 16
// transpose of 32-bit lanes, the kernels' way to turn 16 rows of 16 floats or bf16 pairs into 16
// columns without gathers (and, built on it, the transpose of a bf16 matrix), and the horizontal
// sum and max of 16 floats (softmax statistics).
#pragma once

#include <cstdint>
#include <cstring>

namespace lattice::kernels {

using f32x16 = float __attribute__((vector_size(64)));
using u32x16 = uint32_t __attribute__((vector_size(64)));
using u16x16 = uint16_t __attribute__((vector_size(32)));
using u16x32 = uint16_t __attribute__((vector_size(64)));

// Words (even[i], odd[i]) side by side for i = 0..15: two rows' 16 bf16 as 16 bf16 pairs.
inline u16x32 interleave_pairs(u16x16 even, u16x16 odd) {
  return __builtin_shufflevector(even, odd, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
}

// r[i] lane j becomes r[j] lane i, for a 16-lane vector type of 32-bit elements (float, uint32_t):
// pairs of rows interleaved, then 64-bit pairs within 128-bit lanes, then 128-bit lanes twice
// (AVX-512's unpack, shuffle and shuffle_f32x4).
template <class Vector16>
inline void transpose_16x16(Vector16 r[16]) {
  Vector16 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28,
                                   13, 29);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27,
                                       14, 30, 15, 31);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int odd = 0; odd < 2; ++odd) {
      const Vector16 a = t[i + odd], b = t[i + 2 + odd];
      r[i + 2 * odd] =
          __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      r[i + 2 * odd + 1] =
          __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  }
  const auto even_lanes = [](Vector16 a, Vector16 b) {
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  };
  const auto odd_lanes = [](Vector16 a, Vector16 b) {
    return __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                   31);
  };
  for (int i = 0; i < 4; ++i) {
    t[i] = even_lanes(r[i], r[i + 4]);
    t[i + 4] = odd_lanes(r[i], r[i + 4]);
    t[i + 8] = even_lanes(r[i + 8], r[i + 12]);
    t[i + 12] = odd_lanes(r[i + 8], r[i + 12]);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = even_lanes(t[i], t[i + 8]);
    r[i + 8] = odd_lanes(t[i], t[i + 8]);
  }
}

// dst[d * ld + t] = src[t * src_ld + d] for t < rows, d < cols, bf16 bits (rows a multiple of 16,
// cols of 32): 16 rows by 16 of their bf16 pairs (32-bit words) at a time, transposed in
// registers, each word's halves then going to two rows of dst.
inline void transpose_bf16(uint16_t* dst, int64_t ld, const uint16_t* src, int64_t src_ld,
                           int64_t rows, int64_t cols) {
  for (int64_t t0 = 0; t0 < rows; t0 += 16) {
    for (int64_t d0 = 0; d0 < cols; d0 += 32) {
      u32x16 words[16];
      for (int i = 0; i < 16; ++i)
        std::memcpy(&words[i], src + (t0 + i) * src_ld + d0, sizeof words[i]);
      transpose_16x16(words);
      for (int w = 0; w < 16; ++w) {
        const u16x16 even = __builtin_convertvector(words[w] & 0xffffu, u16x16);
        const u16x16 odd = __builtin_convertvector(words[w] >> 16, u16x16);
        std::memcpy(dst + (d0 + 2 * w) * ld + t0, &even, sizeof even);
        std::memcpy(dst + (d0 + 2 * w + 1) * ld + t0, &odd, sizeof odd);
      }
    }
  }
}

// v with its halves of `width` lanes swapped within each group of 2 * width lanes.
inline f32x16 swap_halves(f32x16 v, int width) {
  switch (width) {
    case 8:
      return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4:
      return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2:
      return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default:
      return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
}

// The sum and the max of the 16 lanes by halving trees (4 shuffles each).
inline float horizontal_sum(f32x16 v) {
  for (int width = 8; width >= 1; width /= 2) v += swap_halves(v, width);
  return v[0];
}
inline float horizontal_max(f32x16 v) {
  for (int width = 8; width >= 1; width /= 2) {
    const f32x16 other = swap_halves(v, width);
    v = other > v ? other : v;
  }
  return v[0];
}

}  // namespace lattice::kernels
