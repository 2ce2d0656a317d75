// Causal grouped-query attention on the CPU, tiled as FlashAttention-2: the forward streams key
// blocks through an online softmax and saves only the log-sum-exp per query; the backward
// recomputes each tile's probabilities from it. Extra memory is O(T * head_dim) per thread.
//
// Precision::fp32: the tile products run on a register-blocked fp32 micro-GEMM (6 rows x 64
// columns) written with GCC/Clang vector extensions (16-lane vectors: one zmm under AVX-512).
//
// Precision::bf16 rounds q, k, v and d_out to bf16, and the probabilities P (and dS in backward) to
// bf16 before the products they feed, with fp32 accumulation and fp32 softmax statistics (row max,
// row sum, lse, D = rowsum(dO * O)), like PyTorch's bf16 flash attention. Where the compiler
// targets AMX and Linux grants the tile state, the products run on AMX (tdpbf16ps); otherwise the
// same rounding is applied and the fp32 micro-GEMM does the products.
//
// attention_forward_bf16 / attention_backward_bf16 run the same AMX code on q, k, v that are bf16
// already (templates over the source type) and write the gradients as bf16 rows with per-batch
// column sums (templates over the gradient sink); without AMX they widen to fp32 and narrow back.
//
// Threading: forward tasks are (batch, kv head, chunk of query blocks); backward tasks are (batch,
// kv head), each owning the dk/dv of its kv head and the dq of its query-head group, so nothing
// races and the result does not depend on the thread count (bitwise).
#include "lattice/kernels/cpu/attention.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <omp.h>

#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"  // LATTICE_HAS_AMX, <immintrin.h> with it
#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"
#include "lattice/kernels/cpu/thread_columns.hpp"

namespace lattice::kernels {

AttentionShape AttentionShape::contiguous(int64_t batch, int64_t seq, int64_t q_heads,
                                          int64_t kv_heads, int64_t head_dim) {
  AttentionShape s;
  s.batch = batch;
  s.q_len = seq;
  s.kv_len = seq;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.q_row_stride = q_heads * head_dim;
  s.k_row_stride = kv_heads * head_dim;
  s.v_row_stride = kv_heads * head_dim;
  s.q_batch_stride = seq * q_heads * head_dim;
  s.kv_batch_stride = seq * kv_heads * head_dim;
  return s;
}

namespace {

// 64-byte vectors passed between these internal (inlined) helpers: GCC's note that their ABI
// differs without AVX-512 does not concern functions that never cross a library boundary.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

using i32x16 = int32_t __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

// Tile sizes: kBlockQ query rows by kBlockK keys. kMicroRows x kMicroVecs*16 is the register block
// of the micro-GEMM (24 accumulators + 4 B vectors + 1 broadcast fit the 32 zmm registers).
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
// The forward streams longer key blocks: its per-row softmax bookkeeping is paid once per block.
constexpr int64_t kForwardBlockK = 128;
constexpr int kMicroRows = 6;
constexpr int kMicroVecs = 4;

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

// C[R, NV*16] (= or +=) A[R, K] * B[K, NV*16]. A's element (r, k) sits at a[r * a_row + k * a_col],
// so a transposed A is just a_row = 1, a_col = its leading dimension. B and C are row-major.
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

using MicroGemm = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                           int64_t, bool);

template <int R>
constexpr MicroGemm micro_for_vecs(int nv) {
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
void gemm_rows(int64_t rows, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
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
void pack_rows(float* tile, int64_t padded_dim, const float* src, int64_t src_stride, int64_t rows,
               int64_t head_dim, bool to_bf16) {
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
void pack_transposed(float* tile, int64_t ld, int64_t padded_dim, const float* src,
                     int64_t src_stride, int64_t rows, int64_t head_dim, bool to_bf16) {
  std::memset(tile, 0, static_cast<size_t>(padded_dim * ld) * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * src_stride;
    for (int64_t d = 0; d < head_dim; ++d) tile[d * ld + r] = maybe_round(row[d], to_bf16);
  }
}

void validate(const AttentionShape& s, const char* who) {
  const std::string name(who);
  check(s.batch > 0 && s.q_len > 0 && s.kv_len > 0 && s.q_heads > 0 && s.kv_heads > 0 &&
            s.head_dim > 0,
        name + ": batch, q_len, kv_len, heads and head_dim must all be positive");
  check(s.q_heads % s.kv_heads == 0, name + ": q_heads (" + std::to_string(s.q_heads) +
                                         ") must be a multiple of kv_heads (" +
                                         std::to_string(s.kv_heads) + ")");
  check(s.kv_len >= s.q_len, name + ": kv_len (" + std::to_string(s.kv_len) +
                                 ") must be at least q_len (" + std::to_string(s.q_len) + ")");
  check(s.q_row_stride >= s.q_heads * s.head_dim,
        name + ": q_row_stride must be at least q_heads * head_dim");
  check(s.k_row_stride >= s.kv_heads * s.head_dim && s.v_row_stride >= s.kv_heads * s.head_dim,
        name + ": k_row_stride and v_row_stride must be at least kv_heads * head_dim");
}

#if defined(LATTICE_HAS_AMX)
// bf16 on AMX: tile products as tdpbf16ps (bf16 pairs, fp32 accumulate), operands packed to the
// layouts the tiles load.

// AMX unless the environment sets LATTICE_ATTENTION_NO_AMX (read per call: it selects the portable
// bf16 path for comparison and debugging, like oneDNN's ONEDNN_MAX_CPU_ISA).
bool use_amx() {
  const char* disable = std::getenv("LATTICE_ATTENTION_NO_AMX");
  return amx_tile_state_granted() && (disable == nullptr || *disable == '\0' || *disable == '0');
}

// C[M, N] (= or +=) A[M, K] * B on the tiles of an AmxTileScope (tmm0-3 accumulate a 32 x 32 fp32
// block, tmm4-5 hold A, tmm6-7 B), with bf16 A (row-major, lda elements) and B in the VNNI layout
// [K/2][N][2] (row stride ldb elements), fp32 C. M, N and K are multiples of 32.
void amx_gemm(int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate) {
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

// Causal forward with bf16 q, k, v, P on AMX; same tasks, tiles and online softmax (fp32) as the
// fp32 path. Tiles are padded to multiples of 32 rows, keys and head_dim with zeros.
template <class Src>
void attention_forward_amx(float* out, float* lse, const Src* q, const Src* k, const Src* v,
                           const AttentionShape& shape) {
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, 32);
  const int64_t group = Hq / Hkv, causal_offset = Tk - Tq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_blocks = (Tq + kBlockQ - 1) / kBlockQ;
  const int64_t key_blocks = (Tk + kForwardBlockK - 1) / kForwardBlockK;
  const int64_t pairs = B * Hkv;
  const int64_t chunks =
      std::clamp<int64_t>((4 * omp_get_max_threads() + pairs - 1) / pairs, 1, q_blocks);
  const int64_t tasks = pairs * chunks;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const f32x16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(kBlockQ % 32 == 0 && kForwardBlockK % 32 == 0, "AMX tiles need 32-multiples");

#pragma omp parallel
  {
    const AmxTileScope tiles;
    // Per thread: K^T panel in VNNI [key block][Dp/2][kForwardBlockK][2], V panel in VNNI
    // [key/2][Dp][2], bf16 Q and P tiles, fp32 S tile, output accumulator, row max and row sum.
    const int64_t panel = key_blocks * kForwardBlockK * Dp;
    Scratch<uint16_t> half(2 * panel + kBlockQ * Dp + kBlockQ * kForwardBlockK);
    uint16_t* kt_vnni = half.get();
    uint16_t* v_vnni = kt_vnni + panel;
    uint16_t* q_bf16 = v_vnni + panel;
    uint16_t* p_bf16 = q_bf16 + kBlockQ * Dp;
    Scratch<float> scratch(kBlockQ * kForwardBlockK + kBlockQ * Dp + 2 * kBlockQ);
    float* s_buf = scratch.get();
    float* o_acc = s_buf + kBlockQ * kForwardBlockK;
    float* row_max = o_acc + kBlockQ * Dp;
    float* row_sum = row_max + kBlockQ;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t chunk = task % chunks, kvh = (task / chunks) % Hkv, b = task / (chunks * Hkv);
      const int64_t last_qb = chunk + (q_blocks - 1 - chunk) / chunks * chunks;
      const int64_t keys = causal_offset + std::min(Tq, (last_qb + 1) * kBlockQ);
      const int64_t keys_p = round_up(keys, 32);
      const Src* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const Src* v_src = v + b * shape.kv_batch_stride + kvh * D;
      // K^T blocks as pairs-transposed B operands (block j0 at j0 * Dp), V rows interleaved.
      if (keys != keys_p || D != Dp) {  // padding keys or head dims meet the tiles as zeros
        std::fill(kt_vnni, kt_vnni + round_up(keys, kForwardBlockK) * Dp, uint16_t{0});
        std::fill(v_vnni, v_vnni + keys_p * Dp, uint16_t{0});
      }
      for (int64_t j0 = 0; j0 < keys; j0 += kForwardBlockK)
        pack_pairs_transposed(kt_vnni + j0 * Dp, kForwardBlockK, k_src + j0 * shape.k_row_stride,
                              shape.k_row_stride, std::min(kForwardBlockK, keys - j0), D);
      pack_rows_interleaved(v_vnni, Dp, v_src, shape.v_row_stride, keys, D);

      for (int64_t qb = last_qb; qb >= 0; qb -= chunks) {
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        const int64_t rows_p = round_up(rows, 32);
        const int64_t key_end = causal_offset + i0 + rows;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          pack_rows_bf16(q_bf16, Dp, q + b * shape.q_batch_stride + i0 * shape.q_row_stride + h * D,
                         shape.q_row_stride, rows, D);
          std::fill(q_bf16 + rows * Dp, q_bf16 + rows_p * Dp, uint16_t{0});
          std::fill(p_bf16 + rows * kForwardBlockK, p_bf16 + rows_p * kForwardBlockK, uint16_t{0});
          std::fill(o_acc, o_acc + rows_p * Dp, 0.0f);
          std::fill(row_max, row_max + rows, neg_inf);
          std::fill(row_sum, row_sum + rows, 0.0f);

          for (int64_t j0 = 0; j0 < key_end; j0 += kForwardBlockK) {
            const int64_t cols = std::min(kForwardBlockK, key_end - j0),
                          cols_p = round_up(cols, 32);
            amx_gemm(rows_p, cols_p, Dp, q_bf16, Dp, kt_vnni + j0 * Dp, 2 * kForwardBlockK, s_buf,
                     kForwardBlockK, false);
            for (int64_t r = 0; r < rows; ++r) {
              float* s_row = s_buf + r * kForwardBlockK;
              uint16_t* p_row = p_bf16 + r * kForwardBlockK;
              const int64_t visible = std::min(cols, causal_offset + i0 + r - j0 + 1);
              if (visible <= 0) {
                std::fill(p_row, p_row + cols_p, uint16_t{0});
                continue;
              }
              // The max of the visible scores, scaled after: rounding s * scale is monotonic in
              // s (scale > 0), so this is the max of the scaled scores bit for bit.
              const f32x16 visible_v = splat(static_cast<float>(visible));
              f32x16 max_v = splat(neg_inf);
              int64_t c = 0;
              for (; c + kLanes <= visible; c += kLanes) {
                const f32x16 sv = load(s_row + c);
                max_v = sv > max_v ? sv : max_v;
              }
              if (c < visible) {
                const f32x16 sv = load(s_row + c);
                const f32x16 seen = (lane_index + static_cast<float>(c)) < visible_v ? sv : max_v;
                max_v = seen > max_v ? seen : max_v;
              }
              const float new_max = std::max(row_max[r], horizontal_max(max_v) * scale);
              const float alpha = std::exp(row_max[r] - new_max);
              f32x16 sum_v = {};
              for (c = 0; c < cols_p; c += kLanes) {
                f32x16 sv = scaled(load(s_row + c), scale);
                if (c + kLanes > visible)  // the causal edge and padding: e^-inf = 0
                  sv = (lane_index + static_cast<float>(c)) < visible_v ? sv : splat(neg_inf);
                const f32x16 p = vexp(sv - new_max);
                sum_v += p;
                store_bf16_normal(p_row + c, p);
              }
              row_sum[r] = row_sum[r] * alpha + horizontal_sum(sum_v);
              row_max[r] = new_max;
              if (alpha != 1.0f) {
                float* o_row = o_acc + r * Dp;
                for (int64_t d = 0; d < Dp; d += kLanes) store(o_row + d, load(o_row + d) * alpha);
              }
            }
            amx_gemm(rows_p, Dp, cols_p, p_bf16, kForwardBlockK, v_vnni + j0 * Dp, 2 * Dp, o_acc,
                     Dp, true);
          }

          float* out_rows = out + (b * Tq + i0) * Hq * D + h * D;
          float* lse_rows = lse + (b * Hq + h) * Tq + i0;
          for (int64_t r = 0; r < rows; ++r) {
            const float inv_sum = 1.0f / row_sum[r];
            for (int64_t d = 0; d < D; ++d) out_rows[r * Hq * D + d] = o_acc[r * Dp + d] * inv_sum;
            lse_rows[r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  }
}

// Where the backward puts dQ, dK and dV: fp32 rows (the strides of q, k, v), or bf16 rows plus
// each batch's column sums of the unrounded values (AttentionGradientsBf16).
struct Fp32GradientRows {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  double* dq_sums = nullptr;  // always null: fp32 rows come without column sums
  double* dk_sums = nullptr;
  double* dv_sums = nullptr;
  int64_t sums_batch_stride = 0;
};

using f64x8 = double __attribute__((vector_size(64)));

// Column sums of 16 lanes in double, kept in registers over a run of rows (a sum in memory would
// put a store-to-load round trip on every row).
struct LaneSums {
  f64x8 low{}, high{};
  void load_from(const double* sums) {
    std::memcpy(&low, sums, sizeof low);
    std::memcpy(&high, sums + 8, sizeof high);
  }
  void store_to(double* sums) const {
    std::memcpy(sums, &low, sizeof low);
    std::memcpy(sums + 8, &high, sizeof high);
  }
  void add(f32x16 row) {
    low +=
        __builtin_convertvector(__builtin_shufflevector(row, row, 0, 1, 2, 3, 4, 5, 6, 7), f64x8);
    high += __builtin_convertvector(__builtin_shufflevector(row, row, 8, 9, 10, 11, 12, 13, 14, 15),
                                    f64x8);
  }
};

// One output row of 16 lanes (masked to `lanes`): stored as fp32, or rounded to bf16 with its
// values added to `sums` (padding lanes hold zeros, so the sums past head_dim stay zero).
inline void store_gradient_row(float* row, f32x16 values, __mmask16 lanes, LaneSums* /*sums*/) {
  _mm512_mask_storeu_ps(row, lanes, std::bit_cast<__m512>(values));
}
inline void store_gradient_row(lattice::bf16* row, f32x16 values, __mmask16 lanes, LaneSums* sums) {
  const u16x16 bits = bf16_bits(values);
  _mm256_mask_storeu_epi16(row, lanes, std::bit_cast<__m256i>(bits));
  if (sums != nullptr) sums->add(values);
}

inline __mmask16 head_lanes(int64_t D, int64_t d0) {
  return D - d0 >= kLanes ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (D - d0)) - 1);
}

// A task's column sums to their place in the caller's per-batch array.
inline void store_column_sums(double* dst, const double* sums, int64_t D) {
  std::copy(sums, sums + D, dst);
}

// Chunks of 16 lanes (a head of up to 256 dims) whose column sums write_transposed and write_rows
// keep in registers side by side: independent chains of adds, each waiting on its own previous row
// only.
constexpr int64_t kMaxSumChunks = 16;

// Takes the lines of `count` output rows of D elements for writing (prefetchw): the gradient rows
// are strided slices of a large buffer, and each partial-line store would otherwise wait for its
// line to come from memory.
template <class Out>
inline void prefetch_rows_for_writing(Out* rows, int64_t row_stride, int64_t count, int64_t D) {
  const int64_t bytes = D * static_cast<int64_t>(sizeof(Out));
  for (int64_t r = 0; r < count; ++r) {
    const char* row = reinterpret_cast<const char*>(rows + r * row_stride);
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 1);
  }
}

// rows[c * row_stride + d] = transposed[d * kBlockK + c] for c < cols, d < D: a key block's dK or
// dV rows from their transposed accumulator ([Dp][kBlockK], Dp a multiple of 32), 16 x 16 at a
// time transposed in registers; with bf16 rows, sums[d] (Dp doubles) += each row in row order.
template <class Out>
void write_transposed(Out* rows, int64_t row_stride, const float* transposed, int64_t cols,
                      int64_t D, double* sums) {
  prefetch_rows_for_writing(rows, row_stride, cols, D);
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  if (sums != nullptr && chunks <= kMaxSumChunks) {
    // Rows outer, head chunks inner: every chunk's sums advance a row at a time, in row order,
    // with the chunks' chains of adds interleaved.
    LaneSums lane_sums[kMaxSumChunks];
    for (int64_t i = 0; i < chunks; ++i) lane_sums[i].load_from(sums + i * kLanes);
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      const int64_t n = std::min<int64_t>(kLanes, cols - c0);
      for (int64_t i = 0; i < chunks; ++i) {
        const int64_t d0 = i * kLanes;
        f32x16 r[16];
        for (int j = 0; j < 16; ++j) r[j] = load(transposed + (d0 + j) * kBlockK + c0);
        transpose_16x16(r);
        const __mmask16 lanes = head_lanes(D, d0);
        for (int64_t j = 0; j < n; ++j)
          store_gradient_row(rows + (c0 + j) * row_stride + d0, r[j], lanes, &lane_sums[i]);
      }
    }
    for (int64_t i = 0; i < chunks; ++i) lane_sums[i].store_to(sums + i * kLanes);
    return;
  }
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    const __mmask16 lanes = head_lanes(D, d0);
    LaneSums lane_sums;
    if (sums != nullptr) lane_sums.load_from(sums + d0);
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      f32x16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load(transposed + (d0 + i) * kBlockK + c0);
      transpose_16x16(r);
      const int64_t n = std::min<int64_t>(kLanes, cols - c0);
      for (int64_t j = 0; j < n; ++j)
        store_gradient_row(rows + (c0 + j) * row_stride + d0, r[j], lanes,
                           sums != nullptr ? &lane_sums : nullptr);
    }
    if (sums != nullptr) lane_sums.store_to(sums + d0);
  }
}

// Rows of a head's dQ whose lines are taken for writing ahead of the row being written.
constexpr int64_t kRowsWrittenAhead = 16;

// rows[t * row_stride + d] = acc[t * Dp + d] for t < T, d < D (a head's dQ), with the sums as in
// write_transposed (rows outer, head chunks inner where the sums fit in registers).
template <class Out>
void write_rows(Out* rows, int64_t row_stride, const float* acc, int64_t Dp, int64_t T, int64_t D,
                double* sums) {
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  if (sums != nullptr && chunks <= kMaxSumChunks) {
    LaneSums lane_sums[kMaxSumChunks];
    for (int64_t i = 0; i < chunks; ++i) lane_sums[i].load_from(sums + i * kLanes);
    prefetch_rows_for_writing(rows, row_stride, std::min<int64_t>(T, kRowsWrittenAhead), D);
    for (int64_t t = 0; t < T; ++t) {
      if (t + kRowsWrittenAhead < T)
        prefetch_rows_for_writing(rows + (t + kRowsWrittenAhead) * row_stride, row_stride, 1, D);
      for (int64_t i = 0; i < chunks; ++i)
        store_gradient_row(rows + t * row_stride + i * kLanes, load(acc + t * Dp + i * kLanes),
                           head_lanes(D, i * kLanes), &lane_sums[i]);
    }
    for (int64_t i = 0; i < chunks; ++i) lane_sums[i].store_to(sums + i * kLanes);
    return;
  }
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    const __mmask16 lanes = head_lanes(D, d0);
    LaneSums lane_sums;
    if (sums != nullptr) lane_sums.load_from(sums + d0);
    for (int64_t t = 0; t < T; ++t)
      store_gradient_row(rows + t * row_stride + d0, load(acc + t * Dp + d0), lanes,
                         sums != nullptr ? &lane_sums : nullptr);
    if (sums != nullptr) lane_sums.store_to(sums + d0);
  }
}

// Causal backward with bf16 q, k, v, dO, P and dS on AMX (FlashAttention-2 order, fp32 softmax
// statistics). Per task (batch, kv head): Q and dO of the group as bf16 rows and transposed, dQ
// accumulators; per key block: K^T, V^T and K as B operands, dK^T and dV^T accumulators.
template <class Src, class Grads>
void attention_backward_amx(const Grads& grads, const float* d_out, const Src* q, const Src* k,
                            const Src* v, const float* out, const float* lse,
                            const AttentionShape& shape) {
  const int64_t B = shape.batch, T = shape.q_len, Hq = shape.q_heads, Hkv = shape.kv_heads;
  const int64_t D = shape.head_dim, Dp = round_up(D, 32), Tp = round_up(T, 32);
  const int64_t group = Hq / Hkv, out_row = Hq * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const f32x16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int64_t tasks = B * Hkv;

#pragma omp parallel
  {
    const AmxTileScope tiles;
    const int64_t head_panel = Tp * Dp, block = kBlockK * Dp, tile = kBlockQ * kBlockK;
    // bf16: Q rows, dO rows, Q^T [Dp][Tp], dO^T [Dp][Tp] per group head; K^T, V^T (pairs
    // transposed) and K (rows interleaved) of one key block; dS rows, P and dS rows interleaved.
    Scratch<uint16_t> half(4 * group * head_panel + 3 * block + 3 * tile);
    uint16_t* q_rows_b = half.get();
    uint16_t* do_rows_b = q_rows_b + group * head_panel;
    uint16_t* q_t = do_rows_b + group * head_panel;
    uint16_t* do_t = q_t + group * head_panel;
    uint16_t* kt_vnni = do_t + group * head_panel;
    uint16_t* vt_vnni = kt_vnni + block;
    uint16_t* k_vnni = vt_vnni + block;
    uint16_t* ds_b = k_vnni + block;
    uint16_t* p_vnni = ds_b + tile;
    uint16_t* ds_vnni = p_vnni + tile;
    // fp32: dQ accumulators [group][Tp][Dp], D_i, S and dP tiles, dK^T and dV^T [Dp][kBlockK].
    Scratch<float> scratch(group * head_panel + group * T + 2 * tile + 2 * block);
    float* dq_acc = scratch.get();
    float* delta = dq_acc + group * head_panel;
    float* s_buf = delta + group * T;
    float* dp_buf = s_buf + tile;
    float* dkt_acc = dp_buf + tile;
    float* dvt_acc = dkt_acc + block;
    // Column sums of one task's dK, dV (bf16 gradients with sums only) and one head's dQ.
    const bool sums_wanted = grads.dq_sums != nullptr;
    std::vector<double> column_sums(static_cast<size_t>(3 * Dp), 0.0);
    double* dk_sums = column_sums.data();
    double* dv_sums = dk_sums + Dp;
    double* dq_sums = dv_sums + Dp;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        uint16_t* qb = q_rows_b + g * head_panel;
        uint16_t* dob = do_rows_b + g * head_panel;
        uint16_t* qt = q_t + g * head_panel;
        uint16_t* dot = do_t + g * head_panel;
        pack_rows_bf16(qb, Dp, q + b * shape.q_batch_stride + h * D, shape.q_row_stride, T, D);
        pack_rows_bf16(dob, Dp, d_out + b * T * out_row + h * D, out_row, T, D);
        std::fill(qb + T * Dp, qb + Tp * Dp, uint16_t{0});
        std::fill(dob + T * Dp, dob + Tp * Dp, uint16_t{0});
        transpose_bf16(qt, Tp, qb, Dp, Tp, Dp);
        transpose_bf16(dot, Tp, dob, Dp, Tp, Dp);
        for (int64_t t = 0; t < T; ++t) {
          const float* o_row = out + (b * T + t) * out_row + h * D;
          const float* do_row = d_out + (b * T + t) * out_row + h * D;
          prefetch_ahead(out + b * T * out_row + h * D, out_row, t, T, D);
          prefetch_ahead(d_out + b * T * out_row + h * D, out_row, t, T, D);
          delta[g * T + t] = dot_product(do_row, o_row, D);
        }
      }
      std::fill(dq_acc, dq_acc + group * head_panel, 0.0f);
      const Src* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const Src* v_src = v + b * shape.kv_batch_stride + kvh * D;
      std::fill(dk_sums, dk_sums + 2 * Dp, 0.0);

      for (int64_t j0 = 0; j0 < T; j0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, T - j0), cols_p = round_up(cols, 32);
        if (cols != cols_p || D != Dp)  // padding keys or head dims meet the tiles as zeros
          std::fill(kt_vnni, kt_vnni + 3 * block, uint16_t{0});
        pack_pairs_transposed(kt_vnni, kBlockK, k_src + j0 * shape.k_row_stride, shape.k_row_stride,
                              cols, D);
        pack_pairs_transposed(vt_vnni, kBlockK, v_src + j0 * shape.v_row_stride, shape.v_row_stride,
                              cols, D);
        pack_rows_interleaved(k_vnni, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride, cols,
                              D);
        std::fill(dkt_acc, dkt_acc + 2 * block, 0.0f);

        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* lse_head = lse + (b * Hq + h) * T;
          for (int64_t i0 = j0 / kBlockQ * kBlockQ; i0 < T; i0 += kBlockQ) {
            const int64_t rows = std::min(kBlockQ, T - i0), rows_p = round_up(rows, 32);
            amx_gemm(rows_p, cols_p, Dp, q_rows_b + g * head_panel + i0 * Dp, Dp, kt_vnni,
                     2 * kBlockK, s_buf, kBlockK, false);
            amx_gemm(rows_p, cols_p, Dp, do_rows_b + g * head_panel + i0 * Dp, Dp, vt_vnni,
                     2 * kBlockK, dp_buf, kBlockK, false);
            // Row pairs: P = exp(S * scale - lse), dS = P * (dP - D_i) * scale, zero where masked
            // and on padding rows; dS as bf16 rows, P and dS as interleaved row pairs.
            for (int64_t r = 0; r < rows_p; r += 2) {
              f32x16 p[2][kBlockK / kLanes] = {}, ds[2][kBlockK / kLanes] = {};
              for (int e = 0; e < 2; ++e) {
                const int64_t row = r + e;
                if (row >= rows) continue;
                const int64_t visible = std::clamp<int64_t>(i0 + row - j0 + 1, 0, cols);
                const f32x16 visible_v = splat(static_cast<float>(visible));
                const float row_lse = lse_head[i0 + row], row_delta = delta[g * T + i0 + row];
                for (int64_t c = 0; c < cols_p; c += kLanes) {
                  // Keys past the causal edge: P = 0 without its exponential (dS is still formed
                  // from it: its zeros keep the sign that 0 * (dP - D_i) gives).
                  f32x16 pv{};
                  if (c < visible) {
                    pv = vexp(load(s_buf + row * kBlockK + c) * scale - row_lse);
                    if (c + kLanes > visible) {
                      const i32x16 keep = (lane_index + static_cast<float>(c)) < visible_v;
                      pv = std::bit_cast<f32x16>(std::bit_cast<i32x16>(pv) & keep);
                    }
                  }
                  p[e][c / kLanes] = pv;
                  ds[e][c / kLanes] = pv * (load(dp_buf + row * kBlockK + c) - row_delta) * scale;
                }
              }
              for (int64_t c = 0; c < cols_p; c += kLanes) {
                const u16x16 ds0 = bf16_bits(ds[0][c / kLanes]);
                const u16x16 ds1 = bf16_bits(ds[1][c / kLanes]);
                std::memcpy(ds_b + r * kBlockK + c, &ds0, sizeof ds0);
                std::memcpy(ds_b + (r + 1) * kBlockK + c, &ds1, sizeof ds1);
                const u16x32 p_pair = interleave_pairs(normal_to_bf16_bits(p[0][c / kLanes]),
                                                       normal_to_bf16_bits(p[1][c / kLanes]));
                const u16x32 ds_pair = interleave_pairs(ds0, ds1);
                std::memcpy(p_vnni + r / 2 * 2 * kBlockK + 2 * c, &p_pair, sizeof p_pair);
                std::memcpy(ds_vnni + r / 2 * 2 * kBlockK + 2 * c, &ds_pair, sizeof ds_pair);
              }
            }
            // dQ_i += dS K_j; dV_j^T += dO_i^T P; dK_j^T += Q_i^T dS.
            amx_gemm(rows_p, Dp, cols_p, ds_b, kBlockK, k_vnni, 2 * Dp,
                     dq_acc + g * head_panel + i0 * Dp, Dp, true);
            amx_gemm(Dp, cols_p, rows_p, do_t + g * head_panel + i0, Tp, p_vnni, 2 * kBlockK,
                     dvt_acc, kBlockK, true);
            amx_gemm(Dp, cols_p, rows_p, q_t + g * head_panel + i0, Tp, ds_vnni, 2 * kBlockK,
                     dkt_acc, kBlockK, true);
          }
        }
        const int64_t key_row = b * shape.kv_batch_stride + j0 * shape.k_row_stride + kvh * D;
        write_transposed(grads.dk + key_row, shape.k_row_stride, dkt_acc, cols, D,
                         sums_wanted ? dk_sums : nullptr);
        write_transposed(grads.dv + key_row, shape.v_row_stride, dvt_acc, cols, D,
                         sums_wanted ? dv_sums : nullptr);
      }
      if (sums_wanted) {
        store_column_sums(grads.dk_sums + b * grads.sums_batch_stride + kvh * D, dk_sums, D);
        store_column_sums(grads.dv_sums + b * grads.sums_batch_stride + kvh * D, dv_sums, D);
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        if (sums_wanted) std::fill(dq_sums, dq_sums + Dp, 0.0);
        write_rows(grads.dq + b * shape.q_batch_stride + h * D, shape.q_row_stride,
                   dq_acc + g * head_panel, Dp, T, D, sums_wanted ? dq_sums : nullptr);
        if (sums_wanted)
          store_column_sums(grads.dq_sums + b * grads.sums_batch_stride + h * D, dq_sums, D);
      }
    }
  }
}
#endif  // AMX

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, Precision precision, MatmulEngine& /*matmul*/) {
  validate(shape, "attention_forward");
#if defined(LATTICE_HAS_AMX)
  if (precision == Precision::bf16 && use_amx()) {
    attention_forward_amx(out, lse, q, k, v, shape);
    return;
  }
#endif
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, kLanes);
  const int64_t group = Hq / Hkv;
  const int64_t causal_offset = Tk - Tq;  // query i sits at absolute position causal_offset + i
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool to_bf16 = precision == Precision::bf16;
  const int64_t q_blocks = (Tq + kBlockQ - 1) / kBlockQ;
  const int64_t key_blocks = (Tk + kForwardBlockK - 1) / kForwardBlockK;
  // Tasks are (batch, kv head, chunk): a task packs its kv head's K^T and V once and serves every
  // query head of the group from them. Chunk c takes query blocks c, c + chunks, ... so chunks
  // carry similar causal work; there are several chunks only when (batch, kv head) pairs are too
  // few to keep the threads busy. Every query row is computed the same way whatever the chunking.
  const int64_t pairs = B * Hkv;
  const int64_t chunks =
      std::clamp<int64_t>((4 * omp_get_max_threads() + pairs - 1) / pairs, 1, q_blocks);
  const int64_t tasks = pairs * chunks;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const f32x16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

#pragma omp parallel
  {
    // Per thread: K^T panel [key block][Dp][kForwardBlockK], V panel [key][Dp], Q tile, S/P tile,
    // output accumulator, row max and row sum.
    const int64_t kt_panel_size = key_blocks * Dp * kForwardBlockK,
                  v_panel_size = key_blocks * kForwardBlockK * Dp;
    const int64_t q_tile = kBlockQ * Dp, s_tile = kBlockQ * kForwardBlockK, o_tile = kBlockQ * Dp;
    Scratch<float> scratch(kt_panel_size + v_panel_size + q_tile + s_tile + o_tile + 2 * kBlockQ);
    float* kt_panel = scratch.get();
    float* v_panel = kt_panel + kt_panel_size;
    float* q_pack = v_panel + v_panel_size;
    float* s_buf = q_pack + q_tile;
    float* o_acc = s_buf + s_tile;
    float* row_max = o_acc + o_tile;
    float* row_sum = row_max + kBlockQ;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t chunk = task % chunks, kvh = (task / chunks) % Hkv, b = task / (chunks * Hkv);
      const int64_t last_qb = chunk + (q_blocks - 1 - chunk) / chunks * chunks;
      const int64_t keys = causal_offset + std::min(Tq, (last_qb + 1) * kBlockQ);
      const float* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const float* v_src = v + b * shape.kv_batch_stride + kvh * D;
      for (int64_t j0 = 0; j0 < keys; j0 += kForwardBlockK)
        pack_transposed(kt_panel + j0 * Dp, kForwardBlockK, Dp, k_src + j0 * shape.k_row_stride,
                        shape.k_row_stride, std::min(kForwardBlockK, keys - j0), D, to_bf16);
      pack_rows(v_panel, Dp, v_src, shape.v_row_stride, keys, D, to_bf16);
      std::fill(v_panel + keys * Dp, v_panel + round_up(keys, kLanes) * Dp, 0.0f);

      for (int64_t qb = last_qb; qb >= 0; qb -= chunks) {
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        const int64_t key_end =
            causal_offset + i0 + rows;  // keys [0, key_end) are seen by some row
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          pack_rows(q_pack, Dp, q + b * shape.q_batch_stride + i0 * shape.q_row_stride + h * D,
                    shape.q_row_stride, rows, D, to_bf16);
          std::fill(o_acc, o_acc + rows * Dp, 0.0f);
          std::fill(row_max, row_max + rows, neg_inf);
          std::fill(row_sum, row_sum + rows, 0.0f);

          for (int64_t j0 = 0; j0 < key_end; j0 += kForwardBlockK) {
            const int64_t cols = std::min(kForwardBlockK, key_end - j0);
            const float* kt_block = kt_panel + j0 * Dp;
            const float* v_block = v_panel + j0 * Dp;
            // One register-block of rows at a time: S = Q K^T, online softmax, O += P V. On the
            // diagonal the group's last row sees the most keys; columns no row sees are skipped.
            for (int64_t m0 = 0; m0 < rows; m0 += kMicroRows) {
              const int64_t group_rows = std::min<int64_t>(kMicroRows, rows - m0);
              const int64_t group_visible =
                  std::min(cols, causal_offset + i0 + m0 + group_rows - j0);
              if (group_visible <= 0) continue;
              const int64_t n_eff = round_up(group_visible, kLanes);
              float* s_rows = s_buf + m0 * kForwardBlockK;
              gemm_rows(group_rows, n_eff, Dp, q_pack + m0 * Dp, Dp, 1, kt_block, kForwardBlockK,
                        s_rows, kForwardBlockK, false);
              for (int64_t r = m0; r < m0 + group_rows; ++r) {
                float* s_row = s_buf + r * kForwardBlockK;
                const int64_t visible = std::min(cols, causal_offset + i0 + r - j0 + 1);
                if (visible <= 0) {
                  std::fill(s_row, s_row + n_eff, 0.0f);
                  continue;
                }
                const f32x16 visible_v = splat(static_cast<float>(visible));
                f32x16 max_v = splat(neg_inf);
                for (int64_t c = 0; c < n_eff; c += kLanes) {
                  f32x16 sv = load(s_row + c) * scale;
                  sv = (lane_index + static_cast<float>(c)) < visible_v ? sv : splat(neg_inf);
                  store(s_row + c, sv);
                  max_v = sv > max_v ? sv : max_v;
                }
                const float new_max = std::max(row_max[r], horizontal_max(max_v));
                const float alpha = std::exp(row_max[r] - new_max);  // 0 on the first block
                f32x16 sum_v = {};
                for (int64_t c = 0; c < n_eff; c += kLanes) {
                  const f32x16 p = vexp(load(s_row + c) - new_max);
                  sum_v += p;
                  store(s_row + c, to_bf16 ? vround_bf16(p) : p);
                }
                row_sum[r] = row_sum[r] * alpha + horizontal_sum(sum_v);
                row_max[r] = new_max;
                if (alpha != 1.0f) {
                  float* o_row = o_acc + r * Dp;
                  for (int64_t d = 0; d < Dp; d += kLanes)
                    store(o_row + d, load(o_row + d) * alpha);
                }
              }
              gemm_rows(group_rows, Dp, group_visible, s_rows, kForwardBlockK, 1, v_block, Dp,
                        o_acc + m0 * Dp, Dp, true);
            }
          }

          float* out_rows = out + (b * Tq + i0) * Hq * D + h * D;
          float* lse_rows = lse + (b * Hq + h) * Tq + i0;
          for (int64_t r = 0; r < rows; ++r) {
            const float inv_sum = 1.0f / row_sum[r];
            for (int64_t d = 0; d < D; ++d) out_rows[r * Hq * D + d] = o_acc[r * Dp + d] * inv_sum;
            lse_rows[r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& shape, Precision precision,
                        MatmulEngine& /*matmul*/) {
  validate(shape, "attention_backward");
  check(shape.q_len == shape.kv_len,
        "attention_backward: q_len must equal kv_len (no backward through a KV cache)");
#if defined(LATTICE_HAS_AMX)
  if (precision == Precision::bf16 && use_amx()) {
    attention_backward_amx(Fp32GradientRows{dq, dk, dv}, d_out, q, k, v, out, lse, shape);
    return;
  }
#endif
  const int64_t B = shape.batch, T = shape.q_len, Hq = shape.q_heads, Hkv = shape.kv_heads;
  const int64_t D = shape.head_dim, Dp = round_up(D, kLanes), group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool to_bf16 = precision == Precision::bf16;
  const int64_t tasks = B * Hkv;
  const int64_t out_row = Hq * D;  // out and d_out are [B, T, Hq*D] contiguous
  const f32x16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

#pragma omp parallel
  {
    // Per thread, for one (batch, kv head): packed Q, dO and dQ accumulator of the whole query-head
    // group, D_i = rowsum(dO * O) per query, packed K block (rows and transposed), V^T block, dK
    // and dV block accumulators, and the P and dS tiles.
    const int64_t group_panel = group * T * Dp;
    const int64_t block_rows = kBlockK * Dp, tile = kBlockQ * kBlockK;
    Scratch<float> scratch(3 * group_panel + group * T + 5 * block_rows + 2 * tile);
    float* q_pack = scratch.get();
    float* do_pack = q_pack + group_panel;
    float* dq_acc = do_pack + group_panel;
    float* delta = dq_acc + group_panel;
    float* k_pack = delta + group * T;
    float* kt_pack = k_pack + block_rows;
    float* vt_pack = kt_pack + block_rows;
    float* dk_acc = vt_pack + block_rows;
    float* dv_acc = dk_acc + block_rows;
    float* p_buf = dv_acc + block_rows;
    float* ds_buf = p_buf + tile;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        pack_rows(q_pack + g * T * Dp, Dp, q + b * shape.q_batch_stride + h * D, shape.q_row_stride,
                  T, D, to_bf16);
        pack_rows(do_pack + g * T * Dp, Dp, d_out + b * T * out_row + h * D, out_row, T, D,
                  to_bf16);
        for (int64_t t = 0; t < T; ++t) {
          const float* o_row = out + (b * T + t) * out_row + h * D;
          const float* do_row = d_out + (b * T + t) * out_row + h * D;
          delta[g * T + t] = dot_product(do_row, o_row, D);
        }
      }
      std::fill(dq_acc, dq_acc + group_panel, 0.0f);
      const float* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const float* v_src = v + b * shape.kv_batch_stride + kvh * D;

      for (int64_t j0 = 0; j0 < T; j0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, T - j0), cols_p = round_up(cols, kLanes);
        pack_rows(k_pack, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride, cols, D,
                  to_bf16);
        pack_transposed(kt_pack, kBlockK, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride,
                        cols, D, to_bf16);
        pack_transposed(vt_pack, kBlockK, Dp, v_src + j0 * shape.v_row_stride, shape.v_row_stride,
                        cols, D, to_bf16);
        std::fill(dk_acc, dk_acc + cols * Dp, 0.0f);
        std::fill(dv_acc, dv_acc + cols * Dp, 0.0f);

        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* lse_head = lse + (b * Hq + h) * T;
          // Query blocks that see at least key j0 (causal): those ending after j0.
          for (int64_t i0 = j0 / kBlockQ * kBlockQ; i0 < T; i0 += kBlockQ) {
            const int64_t rows = std::min(kBlockQ, T - i0);
            const float* q_rows = q_pack + (g * T + i0) * Dp;
            const float* do_rows = do_pack + (g * T + i0) * Dp;
            // Row groups: S = Q K^T and dP = dO V^T on the columns the group sees, then
            // P = exp(S * scale - lse) and dS = P * (dP - D_i) * scale (zero where masked), then
            // dQ_i += dS K_j.
            for (int64_t m0 = 0; m0 < rows; m0 += kMicroRows) {
              const int64_t group_rows = std::min<int64_t>(kMicroRows, rows - m0);
              const int64_t group_visible = std::min(cols, i0 + m0 + group_rows - j0);
              if (group_visible <= 0) continue;
              const int64_t n_eff = round_up(group_visible, kLanes);
              gemm_rows(group_rows, n_eff, Dp, q_rows + m0 * Dp, Dp, 1, kt_pack, kBlockK,
                        p_buf + m0 * kBlockK, kBlockK, false);
              gemm_rows(group_rows, n_eff, Dp, do_rows + m0 * Dp, Dp, 1, vt_pack, kBlockK,
                        ds_buf + m0 * kBlockK, kBlockK, false);
              for (int64_t r = m0; r < m0 + group_rows; ++r) {
                const int64_t visible = std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols);
                float* p_row = p_buf + r * kBlockK;
                float* ds_row = ds_buf + r * kBlockK;
                const float row_lse = lse_head[i0 + r], row_delta = delta[g * T + i0 + r];
                const f32x16 visible_v = splat(static_cast<float>(visible));
                for (int64_t c = 0; c < n_eff; c += kLanes) {
                  const i32x16 keep = (lane_index + static_cast<float>(c)) < visible_v;
                  f32x16 p = vexp(load(p_row + c) * scale - row_lse);
                  p = std::bit_cast<f32x16>(std::bit_cast<i32x16>(p) & keep);
                  f32x16 ds = p * (load(ds_row + c) - row_delta) * scale;
                  if (to_bf16) {
                    p = vround_bf16(p);
                    ds = vround_bf16(ds);
                  }
                  store(p_row + c, p);
                  store(ds_row + c, ds);
                }
                std::fill(p_row + n_eff, p_row + cols_p, 0.0f);
                std::fill(ds_row + n_eff, ds_row + cols_p, 0.0f);
              }
              gemm_rows(group_rows, Dp, group_visible, ds_buf + m0 * kBlockK, kBlockK, 1, k_pack,
                        Dp, dq_acc + (g * T + i0 + m0) * Dp, Dp, true);
            }
            // Column groups: dV_j += P^T dO_i and dK_j += dS^T Q_i over the rows that see them.
            for (int64_t c0 = 0; c0 < cols; c0 += kMicroRows) {
              const int64_t group_cols = std::min<int64_t>(kMicroRows, cols - c0);
              const int64_t first_row = std::clamp<int64_t>(j0 + c0 - i0, 0, rows);
              if (first_row >= rows) continue;
              gemm_rows(group_cols, Dp, rows - first_row, p_buf + first_row * kBlockK + c0, 1,
                        kBlockK, do_rows + first_row * Dp, Dp, dv_acc + c0 * Dp, Dp, true);
              gemm_rows(group_cols, Dp, rows - first_row, ds_buf + first_row * kBlockK + c0, 1,
                        kBlockK, q_rows + first_row * Dp, Dp, dk_acc + c0 * Dp, Dp, true);
            }
          }
        }
        float* dk_rows = dk + b * shape.kv_batch_stride + j0 * shape.k_row_stride + kvh * D;
        float* dv_rows = dv + b * shape.kv_batch_stride + j0 * shape.v_row_stride + kvh * D;
        for (int64_t c = 0; c < cols; ++c) {
          std::memcpy(dk_rows + c * shape.k_row_stride, dk_acc + c * Dp,
                      static_cast<size_t>(D) * sizeof(float));
          std::memcpy(dv_rows + c * shape.v_row_stride, dv_acc + c * Dp,
                      static_cast<size_t>(D) * sizeof(float));
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        float* dq_rows = dq + b * shape.q_batch_stride + h * D;
        for (int64_t t = 0; t < T; ++t)
          std::memcpy(dq_rows + t * shape.q_row_stride, dq_acc + (g * T + t) * Dp,
                      static_cast<size_t>(D) * sizeof(float));
      }
    }
  }
}

namespace {

// Dense fp32 copies of bf16 rows (the portable path of the bf16-input entry points): `rows` token
// rows of `width` elements at `src` (row stride src_stride, batch stride src_batch) for each batch,
// in storage left uninitialised (every element is written), the rows spread over the threads.
std::unique_ptr<float[]> widen_rows(const lattice::bf16* src, int64_t batches, int64_t rows,
                                    int64_t width, int64_t src_stride, int64_t src_batch) {
  auto dense = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(batches * rows * width));
  const int64_t total = batches * rows;
#pragma omp parallel for schedule(static) if (total * width >= (1 << 15))
  for (int64_t r = 0; r < total; ++r) {
    convert_to_f32_on_this_thread(dense.get() + r * width,
                                  src + (r / rows) * src_batch + (r % rows) * src_stride, width);
  }
  return dense;
}

// The dense fp32 gradient [batches, rows, width] rounded into strided bf16 rows, with each batch's
// column sums (double, token order) when sums is not null: each thread rounds and sums its own
// columns of every row (thread_columns), so every column is still summed row by row and the
// results do not depend on the thread count.
void narrow_rows(lattice::bf16* dst, double* sums, int64_t sums_batch_stride, const float* dense,
                 int64_t batches, int64_t rows, int64_t width, int64_t dst_stride,
                 int64_t dst_batch) {
#pragma omp parallel if (batches * rows * width >= (1 << 15))
  {
    const ColumnRange range = thread_columns(width, omp_get_thread_num(), omp_get_num_threads());
    for (int64_t b = 0; b < batches && range.width() > 0; ++b) {
      double* batch_sums = sums != nullptr ? sums + b * sums_batch_stride : nullptr;
      if (batch_sums != nullptr) std::fill(batch_sums + range.begin, batch_sums + range.end, 0.0);
      for (int64_t t = 0; t < rows; ++t) {
        const float* row = dense + (b * rows + t) * width;
        convert_to_bf16_on_this_thread(dst + b * dst_batch + t * dst_stride + range.begin,
                                       row + range.begin, range.width());
        if (batch_sums == nullptr) continue;
        for (int64_t j = range.begin; j < range.end; ++j)
          batch_sums[j] += static_cast<double>(row[j]);
      }
    }
  }
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q, const lattice::bf16* k,
                            const lattice::bf16* v, const AttentionShape& shape) {
  validate(shape, "attention_forward_bf16");
#if defined(LATTICE_HAS_AMX)
  if (use_amx()) {
    attention_forward_amx(out, lse, q, k, v, shape);
    return;
  }
#endif
  const AttentionShape& s = shape;
  const auto q32 =
      widen_rows(q, s.batch, s.q_len, s.q_heads * s.head_dim, s.q_row_stride, s.q_batch_stride);
  const auto k32 =
      widen_rows(k, s.batch, s.kv_len, s.kv_heads * s.head_dim, s.k_row_stride, s.kv_batch_stride);
  const auto v32 =
      widen_rows(v, s.batch, s.kv_len, s.kv_heads * s.head_dim, s.v_row_stride, s.kv_batch_stride);
  AttentionShape dense =
      AttentionShape::contiguous(s.batch, s.q_len, s.q_heads, s.kv_heads, s.head_dim);
  dense.kv_len = s.kv_len;
  dense.kv_batch_stride = s.kv_len * s.kv_heads * s.head_dim;
  MatmulEngine unused;
  attention_forward(out, lse, q32.get(), k32.get(), v32.get(), dense, Precision::bf16, unused);
}

void attention_backward_bf16(const AttentionGradientsBf16& grads, const float* d_out,
                             const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                             const float* out, const float* lse, const AttentionShape& shape) {
  validate(shape, "attention_backward_bf16");
  check(shape.q_len == shape.kv_len,
        "attention_backward_bf16: q_len must equal kv_len (no backward through a KV cache)");
  const bool sums = grads.dq_sums != nullptr;
  check(sums == (grads.dk_sums != nullptr) && sums == (grads.dv_sums != nullptr),
        "attention_backward_bf16: give all three column-sum arrays (dq, dk, dv) or none");
#if defined(LATTICE_HAS_AMX)
  if (use_amx()) {
    attention_backward_amx(grads, d_out, q, k, v, out, lse, shape);
    return;
  }
#endif
  const AttentionShape& s = shape;
  const int64_t T = s.q_len, q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const auto q32 = widen_rows(q, s.batch, T, q_width, s.q_row_stride, s.q_batch_stride);
  const auto k32 = widen_rows(k, s.batch, T, kv_width, s.k_row_stride, s.kv_batch_stride);
  const auto v32 = widen_rows(v, s.batch, T, kv_width, s.v_row_stride, s.kv_batch_stride);
  // Overwritten by attention_backward: no zero fill.
  auto dq32 = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * T * q_width));
  auto dk32 = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * T * kv_width));
  auto dv32 = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(s.batch * T * kv_width));
  const AttentionShape dense =
      AttentionShape::contiguous(s.batch, T, s.q_heads, s.kv_heads, s.head_dim);
  MatmulEngine unused;
  attention_backward(dq32.get(), dk32.get(), dv32.get(), d_out, q32.get(), k32.get(), v32.get(),
                     out, lse, dense, Precision::bf16, unused);
  narrow_rows(grads.dq, grads.dq_sums, grads.sums_batch_stride, dq32.get(), s.batch, T, q_width,
              s.q_row_stride, s.q_batch_stride);
  narrow_rows(grads.dk, grads.dk_sums, grads.sums_batch_stride, dk32.get(), s.batch, T, kv_width,
              s.k_row_stride, s.kv_batch_stride);
  narrow_rows(grads.dv, grads.dv_sums, grads.sums_batch_stride, dv32.get(), s.batch, T, kv_width,
              s.v_row_stride, s.kv_batch_stride);
}

}  // namespace lattice::kernels
