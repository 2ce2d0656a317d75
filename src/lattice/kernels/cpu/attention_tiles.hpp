// Tile helpers shared by the attention kernels (private to kernels/cpu): the 16-lane vector
// helpers (load, store, exp, bf16 rounding), the tile sizes, the register-blocked fp32 micro-GEMM
// the portable path multiplies with, per-thread scratch and the fp32 tile packers. Everything here
// is GCC/Clang vector-extension code (one zmm per vector under AVX-512, two ymm under AVX2), but
// for the micro-GEMM's AVX2 form, which names its fused multiply-adds.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <new>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

// 64-byte vectors passed between these internal (inlined) helpers: GCC's note that their ABI
// differs without AVX-512 does not concern functions that never cross a library boundary.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace lattice::kernels::attention_detail {

using i32x16 = int32_t __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

// Tile sizes: kBlockQ query rows by kBlockK keys. kMicroRows x kMicroVecs*16 is the register block
// of the micro-GEMM, sized to the register file the portable code is compiled for: with AVX-512,
// 24 accumulators + 4 B vectors + 1 broadcast fit the 32 zmm registers; without it (x86-64-v3,
// AVX2 hosts) a 16-lane vector is two ymm, and 6 x 1 vectors (12 ymm accumulators + 2 B halves +
// 1 broadcast of the 16 ymm registers, BLIS's Haswell 6 x 16 block) keep the accumulators in
// registers where 6 x 4 spilled most of them to the stack. Each output element sums over k in the
// same order either way, so the two blockings give the same bits.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
// The forward streams longer key blocks: its per-row softmax bookkeeping is paid once per block.
constexpr int64_t kForwardBlockK = 128;
constexpr int kMicroRows = 6;
#if defined(__AVX512F__)
constexpr int kMicroVecs = 4;
#else
constexpr int kMicroVecs = 1;
#endif

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f32x16 v) {
  std::memcpy(p, &v, sizeof v);
}
inline f32x16 splat(float x) {
  return f32x16{} + x;
}

inline int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2/2, degree-6 Taylor polynomial for e^r
// (relative error about 2e-7), times 2^n built in the exponent bits. Lanes below -87.3 (including
// -inf) give 0; lanes above 88 saturate at e^88 (attention only feeds x <= 0).
inline f32x16 vexp(f32x16 x) {
  const f32x16 lo = splat(-87.3f), hi = splat(88.0f);
  const i32x16 underflow = x < lo;
  f32x16 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const f32x16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const f32x16 t = xc * 1.44269504088896341f + magic;
  const f32x16 n = t - magic;
  f32x16 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f32x16 p = splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i32x16 n_int = std::bit_cast<i32x16>(t) - 0x4B400000;
  const i32x16 two_n_bits = (n_int + 127) << 23;
  const f32x16 result = p * std::bit_cast<f32x16>(two_n_bits);
  return std::bit_cast<f32x16>(std::bit_cast<i32x16>(result) & ~underflow);
}

// Round 16 finite lanes to the nearest bf16 (ties to even), kept in fp32 format.
inline f32x16 vround_bf16(f32x16 x) {
  const u32x16 bits = std::bit_cast<u32x16>(x);
  const u32x16 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<f32x16>(rounded);
}

// sum_i a_i b_i in fp32, 16 lanes at a time.
inline float dot_product(const float* a, const float* b, int64_t n) {
  f32x16 acc = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += load(a + i) * load(b + i);
  float sum = horizontal_sum(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Rows of a head's dQ whose lines are taken for writing ahead of the row being written.
constexpr int64_t kRowsWrittenAhead = 16;

// Takes the lines of `count` output rows of D elements for writing (prefetchw): attention's
// outputs and gradients are strided slices of large buffers (a head's columns of token rows), and
// each partial-line store would otherwise wait for its line to come from memory.
template <class Out>
inline void prefetch_rows_for_writing(Out* rows, int64_t row_stride, int64_t count, int64_t D) {
  const int64_t bytes = D * static_cast<int64_t>(sizeof(Out));
  for (int64_t r = 0; r < count; ++r) {
    const char* row = reinterpret_cast<const char*>(rows + r * row_stride);
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 1);
  }
}

// C[R, NV*16] (= or +=) A[R, K] * B[K, NV*16]. A's element (r, k) sits at a[r * a_row + k * a_col],
// so a transposed A is just a_row = 1, a_col = its leading dimension. B and C are row-major.
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// Compiled for AVX2 (x86-64-v3, AMD Zen 3): each product added with one fused multiply-add on
// 8-lane registers, where the ISO C++ build (-ffp-contract=off) would issue a multiply and an add,
// half the FMA units' rate. One rounding instead of two per term: these bits differ from an AVX-512
// build's (which keeps its multiply and add; attention's tests bound both against references).
// Only attention_portable.cpp instantiates it; the AVX-512 and AMX files never do.
template <int R, int NV>
void micro_gemm(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                int64_t ldc, int64_t K, bool accumulate) {
  constexpr int kHalves = 2 * NV;  // 8-lane registers per row
  __m256 acc[R][kHalves];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < kHalves; ++h)
      acc[r][h] = accumulate ? _mm256_loadu_ps(c + r * ldc + h * 8) : _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 bv[kHalves];
#pragma GCC unroll 8
    for (int h = 0; h < kHalves; ++h) bv[h] = _mm256_loadu_ps(b + k * ldb + h * 8);
    const float* a_k = a + k * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 a_rk = _mm256_set1_ps(a_k[r * a_row]);
#pragma GCC unroll 8
      for (int h = 0; h < kHalves; ++h) acc[r][h] = _mm256_fmadd_ps(a_rk, bv[h], acc[r][h]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < kHalves; ++h) _mm256_storeu_ps(c + r * ldc + h * 8, acc[r][h]);
}
#else
template <int R, int NV>
void micro_gemm(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                int64_t ldc, int64_t K, bool accumulate) {
  f32x16 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(c + r * ldc + v * kLanes) : f32x16{};
  for (int64_t k = 0; k < K; ++k) {
    f32x16 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load(b + k * ldb + v * kLanes);
    const float* a_k = a + k * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float a_rk = a_k[r * a_row];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a_rk * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}
#endif

using MicroGemm = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                           int64_t, bool);

template <int R>
constexpr MicroGemm micro_for_vecs(int nv) {
  if constexpr (kMicroVecs == 1) {
    return &micro_gemm<R, 1>;
  } else {
    switch (nv) {
      case 1:
        return &micro_gemm<R, 1>;
      case 2:
        return &micro_gemm<R, 2>;
      case 3:
        return &micro_gemm<R, 3>;
      default:
        return &micro_gemm<R, 4>;
    }
  }
}

inline MicroGemm micro_for(int rows, int nv) {
  switch (rows) {
    case 1:
      return micro_for_vecs<1>(nv);
    case 2:
      return micro_for_vecs<2>(nv);
    case 3:
      return micro_for_vecs<3>(nv);
    case 4:
      return micro_for_vecs<4>(nv);
    case 5:
      return micro_for_vecs<5>(nv);
    default:
      return micro_for_vecs<6>(nv);
  }
}

// C[rows, N] (= or +=) A[rows, K] * B[K, N] for rows <= kMicroRows, N a multiple of 16 (tiles are
// zero-padded to make it so).
inline void gemm_rows(int64_t rows, int64_t N, int64_t K, const float* a, int64_t a_row,
                      int64_t a_col, const float* b, int64_t ldb, float* c, int64_t ldc,
                      bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += kMicroVecs * kLanes) {
    const int nv = static_cast<int>(std::min<int64_t>(kMicroVecs, (N - n0) / kLanes));
    micro_for(static_cast<int>(rows), nv)(a, a_row, a_col, b + n0, ldb, c + n0, ldc, K, accumulate);
  }
}

// 64-byte aligned, uninitialised scratch owned by one thread.
template <class T>
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : data_(static_cast<T*>(
            ::operator new[](static_cast<size_t>(n) * sizeof(T), std::align_val_t(64)))) {}
  ~Scratch() { ::operator delete[](data_, std::align_val_t(64)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  T* data_;
};

inline float maybe_round(float x, bool to_bf16) {
  return to_bf16 ? round_to_bf16(x) : x;
}

// rows x head_dim from a strided source into a [rows, padded_dim] tile, zero-padding the columns.
inline void pack_rows(float* tile, int64_t padded_dim, const float* src, int64_t src_stride,
                      int64_t rows, int64_t head_dim, bool to_bf16) {
  const int64_t full = head_dim / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = tile + r * padded_dim;
    const float* row = src + r * src_stride;
    for (int64_t d = 0; d < full; d += kLanes) {
      const f32x16 x = load(row + d);
      store(dst + d, to_bf16 ? vround_bf16(x) : x);
    }
    for (int64_t d = full; d < head_dim; ++d) dst[d] = maybe_round(row[d], to_bf16);
    for (int64_t d = head_dim; d < padded_dim; ++d) dst[d] = 0.0f;
  }
}

// rows x head_dim from a strided source into the transposed tile [padded_dim, ld], zero elsewhere.
inline void pack_transposed(float* tile, int64_t ld, int64_t padded_dim, const float* src,
                            int64_t src_stride, int64_t rows, int64_t head_dim, bool to_bf16) {
  std::memset(tile, 0, static_cast<size_t>(padded_dim * ld) * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * src_stride;
    for (int64_t d = 0; d < head_dim; ++d) tile[d * ld + r] = maybe_round(row[d], to_bf16);
  }
}

}  // namespace lattice::kernels::attention_detail
