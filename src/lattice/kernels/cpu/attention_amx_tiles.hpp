// AMX helpers of the attention kernels (private to kernels/cpu; ISA-specific: AMX tiles, AVX-512
// and AVX512-BF16 intrinsics): the tile GEMM the forward and backward multiply with, bf16 rounding
// of 16 lanes, and the packers that lay q, k, v (fp32 or bf16 rows) out as tile operands. Only
// compiled where the build targets AMX (LATTICE_HAS_AMX, amx_tiles.hpp).
#pragma once

#include "lattice/kernels/cpu/amx_tiles.hpp"  // LATTICE_HAS_AMX, <immintrin.h> with it

#if defined(LATTICE_HAS_AMX)
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/attention_tiles.hpp"
#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

namespace lattice::kernels::attention_detail {

// C[M, N] (= or +=) A[M, K] * B on the tiles of an AmxTileScope (tmm0-3 accumulate a 32 x 32 fp32
// block, tmm4-5 hold A, tmm6-7 B), with bf16 A (row-major, lda elements) and B in the VNNI layout
// [K/2][N][2] (row stride ldb elements), fp32 C. M, N and K are multiples of 32.
inline void amx_gemm(int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
                     const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t c_stride = ldc * 4, a_stride = lda * 2, b_stride = ldb * 2;
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      float* c00 = c + m0 * ldc + n0;
      if (accumulate)
        amx_block_load(c00, c_stride);
      else
        amx_block_zero();
      for (int64_t k0 = 0; k0 < K; k0 += 32)
        amx_block_multiply(a + m0 * lda + k0, a_stride, b + (k0 / 2) * ldb + n0 * 2,
                           b + (k0 / 2) * ldb + (n0 + 16) * 2, b_stride);
      amx_block_store(c00, c_stride);
    }
  }
}

// 16 lanes rounded to the nearest bf16 (ties to even) as bf16 bits: bf16_vector.hpp's rounding
// (vcvtneps2bf16 unless a lane is denormal, then lattice::to_bf16's integer arithmetic).
inline u16x16 bf16_bits(f32x16 x) {
  return std::bit_cast<u16x16>(to_bf16_bits(std::bit_cast<__m512>(x)));
}
inline void store_bf16(uint16_t* p, f32x16 x) {
  const u16x16 bits = bf16_bits(x);
  std::memcpy(p, &bits, sizeof bits);
}

// x * scale rounded to fp32 (an instruction the compiler does not contract with a following
// subtraction into an FMA, as it may an ordinary product; the zero-masked form with every lane
// selected: GCC 12 warns, falsely, on the unmasked form's undefined pass-through operand).
inline f32x16 scaled(f32x16 x, float scale) {
  return _mm512_maskz_mul_round_ps(0xffff, x, _mm512_set1_ps(scale),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// bf16_bits for lanes that are normal numbers or zero (probabilities): the conversion instruction
// without the denormal test.
inline u16x16 normal_to_bf16_bits(f32x16 x) {
#if defined(__AVX512BF16__)
  return std::bit_cast<u16x16>(_mm512_cvtneps_pbh(x));
#else
  return bf16_bits(x);
#endif
}
inline void store_bf16_normal(uint16_t* p, f32x16 x) {
  const u16x16 bits = normal_to_bf16_bits(x);
  std::memcpy(p, &bits, sizeof bits);
}

// Rows this many ahead of the one being packed are prefetched: packed rows are strided (a head's
// slice of a token row), which the hardware prefetchers do not follow across pages.
constexpr int64_t kPrefetchRows = 8;

// Prefetches the head_dim elements of the row `ahead` rows after `r` (when it exists) into cache.
template <class Src>
inline void prefetch_ahead(const Src* src, int64_t src_stride, int64_t r, int64_t rows,
                           int64_t head_dim) {
  const int64_t ahead = r + kPrefetchRows;
  if (ahead >= rows) return;
  const char* row = reinterpret_cast<const char*>(src + ahead * src_stride);
  const int64_t bytes = head_dim * static_cast<int64_t>(sizeof(Src));
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset);
}

// Two runs of 16 bf16 as one run of 32.
inline u16x32 interleave_halves(u16x16 first, u16x16 second) {
  return __builtin_shufflevector(first, second, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
                                 31);
}

// 16 source elements as bf16 bits: fp32 rounded to nearest even, bf16 as they are.
inline u16x16 bf16_bits16(const float* p) {
  return bf16_bits(load(p));
}
inline u16x16 bf16_bits16(const lattice::bf16* p) {
  u16x16 bits;
  std::memcpy(&bits, p, sizeof bits);
  return bits;
}
inline uint16_t bf16_bits(float x) {
  return to_bf16(x).bits;
}
inline uint16_t bf16_bits(lattice::bf16 x) {
  return x.bits;
}

// B operand "X^T" of a product that contracts over head_dim, from rows x head_dim of X (strided):
// element (d, row) at dst[(d / 2) * 2 * ld + 2 * row + d % 2], i.e. X's bf16 pairs (d, d+1) are
// 32-bit words laid out transposed. dst must be zeroed by the caller (padding stays zero).
template <class Src>
void pack_pairs_transposed(uint16_t* dst, int64_t ld, const Src* src, int64_t src_stride,
                           int64_t rows, int64_t head_dim) {
  const int64_t d_full = head_dim / kLanes * kLanes;
  if (rows % kLanes == 0 && head_dim % 32 == 0) {
    // 16 rows by 16 of their bf16 pairs (32-bit words) at a time, transposed in registers: word w
    // of row r goes to dst word w * ld + r.
    for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
      // The next group's rows (the hardware prefetchers do not follow the strided rows).
      for (int64_t r = r0 + kLanes; r < std::min(rows, r0 + 2 * kLanes); ++r)
        prefetch_ahead(src, src_stride, r - kPrefetchRows, rows, head_dim);
      for (int64_t d0 = 0; d0 < head_dim; d0 += 32) {
        u32x16 words[kLanes];
        for (int i = 0; i < kLanes; ++i) {
          const Src* row = src + (r0 + i) * src_stride + d0;
          const u16x32 bits = interleave_halves(bf16_bits16(row), bf16_bits16(row + kLanes));
          std::memcpy(&words[i], &bits, sizeof bits);
        }
        transpose_16x16(words);
        for (int w = 0; w < kLanes; ++w)
          std::memcpy(dst + (d0 / 2 + w) * 2 * ld + 2 * r0, &words[w], sizeof words[w]);
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    prefetch_ahead(src, src_stride, r, rows, head_dim);
    const Src* row = src + r * src_stride;
    uint16_t* column = dst + 2 * r;
    for (int64_t d = 0; d < d_full; d += kLanes) {
      const u16x16 bits = bf16_bits16(row + d);
      for (int w = 0; w < kLanes / 2; ++w)
        std::memcpy(column + (d / 2 + w) * 2 * ld, &bits[2 * w], 4);
    }
    for (int64_t d = d_full; d < head_dim; ++d) column[d / 2 * 2 * ld + d % 2] = bf16_bits(row[d]);
  }
}

// B operand "X" of a product that contracts over X's rows: element (row, d) at
// dst[(row / 2) * 2 * padded_dim + 2 * d + row % 2] (rows pairwise interleaved). dst must be zeroed
// by the caller.
template <class Src>
void pack_rows_interleaved(uint16_t* dst, int64_t padded_dim, const Src* src, int64_t src_stride,
                           int64_t rows, int64_t head_dim) {
  const int64_t d_full = head_dim / kLanes * kLanes;
  for (int64_t r = 0; r < rows; r += 2) {
    prefetch_ahead(src, src_stride, r, rows, head_dim);
    prefetch_ahead(src, src_stride, r + 1, rows, head_dim);
    const Src* row0 = src + r * src_stride;
    const Src* row1 = r + 1 < rows ? row0 + src_stride : nullptr;
    uint16_t* pair = dst + r / 2 * 2 * padded_dim;
    for (int64_t d = 0; d < d_full; d += kLanes) {
      const u16x32 mixed =
          interleave_pairs(bf16_bits16(row0 + d), row1 ? bf16_bits16(row1 + d) : u16x16{});
      std::memcpy(pair + 2 * d, &mixed, sizeof mixed);
    }
    for (int64_t d = d_full; d < head_dim; ++d) {
      pair[2 * d] = bf16_bits(row0[d]);
      if (row1) pair[2 * d + 1] = bf16_bits(row1[d]);
    }
  }
}

// rows x head_dim (strided) -> bf16 [rows, padded_dim], zero-padded columns.
template <class Src>
void pack_rows_bf16(uint16_t* tile, int64_t padded_dim, const Src* src, int64_t src_stride,
                    int64_t rows, int64_t head_dim) {
  const int64_t full = head_dim / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    prefetch_ahead(src, src_stride, r, rows, head_dim);
    uint16_t* dst = tile + r * padded_dim;
    const Src* row = src + r * src_stride;
    for (int64_t d = 0; d < full; d += kLanes) {
      const u16x16 bits = bf16_bits16(row + d);
      std::memcpy(dst + d, &bits, sizeof bits);
    }
    for (int64_t d = full; d < head_dim; ++d) dst[d] = bf16_bits(row[d]);
    for (int64_t d = head_dim; d < padded_dim; ++d) dst[d] = 0;
  }
}

}  // namespace lattice::kernels::attention_detail
#endif  // LATTICE_HAS_AMX
