// The bf16 attention backward on AMX tiles (ISA-specific: AMX, AVX-512): FlashAttention-2 order
// with bf16 q, k, v, dO, P and dS multiplied by tdpbf16ps and fp32 softmax statistics, writing
// fp32 gradient rows (attention_backward with Precision::bf16) or bf16 rows with per-batch column
// sums (attention_backward_bf16), through the gradient writers below.
#include "lattice/kernels/cpu/attention_amx_tiles.hpp"

#if defined(LATTICE_HAS_AMX)
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "lattice/kernels/cpu/attention_paths.hpp"

namespace lattice::kernels::attention_detail {
namespace {

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
  // (The zero-masked forms with every lane selected: GCC 12 warns, falsely, on the unmasked
  // forms' undefined pass-through operand.)
  void add(f32x16 row) {
    const __m512 lanes = std::bit_cast<__m512>(row);
    low += std::bit_cast<f64x8>(
        _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, lanes, 0)));
    high += std::bit_cast<f64x8>(
        _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, lanes, 1)));
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

// rows[c * row_stride + d] = transposed[d * kBlockK + c] for c < cols, d < D: a key block's dK or
// dV rows from their transposed accumulator ([Dp][kBlockK], Dp a multiple of 32), 16 x 16 at a
// time transposed in registers; with bf16 rows, sums[d] (Dp doubles) += each row in row order.
// Rows from `prefetched` on are taken for writing first (the caller took the others earlier).
template <class Out>
void write_transposed(Out* rows, int64_t row_stride, const float* transposed, int64_t cols,
                      int64_t D, double* sums, int64_t prefetched) {
  if (prefetched < cols)
    prefetch_rows_for_writing(rows + prefetched * row_stride, row_stride, cols - prefetched, D);
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  if (sums != nullptr && chunks <= kMaxSumChunks) {
    // Rows outer, head chunks inner: every chunk's sums advance a row at a time, in row order,
    // with the chunks' chains of adds interleaved (each 16 rows' chunks transposed first).
    LaneSums lane_sums[kMaxSumChunks];
    for (int64_t i = 0; i < chunks; ++i) lane_sums[i].load_from(sums + i * kLanes);
    f32x16 r[kMaxSumChunks][16];
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      const int64_t n = std::min<int64_t>(kLanes, cols - c0);
      for (int64_t i = 0; i < chunks; ++i) {
        for (int j = 0; j < 16; ++j) r[i][j] = load(transposed + (i * kLanes + j) * kBlockK + c0);
        transpose_16x16(r[i]);
      }
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < chunks; ++i)
          store_gradient_row(rows + (c0 + j) * row_stride + i * kLanes, r[i][j],
                             head_lanes(D, i * kLanes), &lane_sums[i]);
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

// rows[t * row_stride + d] += acc[t * Dp + d] for t < T, d < D (a head's dQ added to fp32 rows).
inline void add_rows(float* rows, int64_t row_stride, const float* acc, int64_t Dp, int64_t T,
                     int64_t D) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) rows[t * row_stride + d] += acc[t * Dp + d];
}

// Backward with bf16 q, k, v, dO, P and dS on AMX (FlashAttention-2 order, fp32 softmax
// statistics). Per task (batch, kv head): Q and dO of the group as bf16 rows and transposed, dQ
// accumulators; per key block: K^T, V^T and K as B operands, dK^T and dV^T accumulators.
template <class Src, class Grads>
void backward_amx(const Grads& grads, const float* d_out, const Src* q, const Src* k, const Src* v,
                  const float* out, const float* lse, const AttentionShape& shape) {
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, 32);
  const int64_t Tp = round_up(Tq, 32), group = Hq / Hkv, out_row = Hq * D;
  const int64_t causal_offset = attention_detail::causal_offset(shape);  // sees keys <= it + i
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
    Scratch<float> scratch(group * head_panel + group * Tq + 2 * tile + 2 * block);
    float* dq_acc = scratch.get();
    float* delta = dq_acc + group * head_panel;
    float* s_buf = delta + group * Tq;
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
        pack_rows_bf16(qb, Dp, q + b * shape.q_batch_stride + h * D, shape.q_row_stride, Tq, D);
        pack_rows_bf16(dob, Dp, d_out + b * Tq * out_row + h * D, out_row, Tq, D);
        std::fill(qb + Tq * Dp, qb + Tp * Dp, uint16_t{0});
        std::fill(dob + Tq * Dp, dob + Tp * Dp, uint16_t{0});
        transpose_bf16(qt, Tp, qb, Dp, Tp, Dp);
        transpose_bf16(dot, Tp, dob, Dp, Tp, Dp);
        for (int64_t t = 0; t < Tq; ++t) {
          const float* o_row = out + (b * Tq + t) * out_row + h * D;
          const float* do_row = d_out + (b * Tq + t) * out_row + h * D;
          prefetch_ahead(out + b * Tq * out_row + h * D, out_row, t, Tq, D);
          prefetch_ahead(d_out + b * Tq * out_row + h * D, out_row, t, Tq, D);
          delta[g * Tq + t] = dot_product(do_row, o_row, D);
        }
      }
      std::fill(dq_acc, dq_acc + group * head_panel, 0.0f);
      const Src* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const Src* v_src = v + b * shape.kv_batch_stride + kvh * D;
      std::fill(dk_sums, dk_sums + 2 * Dp, 0.0);

      for (int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, Tk - j0), cols_p = round_up(cols, 32);
        // Query rows from first_query on see key j0 or later ones of the block.
        const int64_t first_query = std::clamp<int64_t>(j0 - causal_offset, 0, Tq);
        if (cols != cols_p || D != Dp)  // padding keys or head dims meet the tiles as zeros
          std::fill(kt_vnni, kt_vnni + 3 * block, uint16_t{0});
        pack_pairs_transposed(kt_vnni, kBlockK, k_src + j0 * shape.k_row_stride, shape.k_row_stride,
                              cols, D);
        pack_pairs_transposed(vt_vnni, kBlockK, v_src + j0 * shape.v_row_stride, shape.v_row_stride,
                              cols, D);
        pack_rows_interleaved(k_vnni, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride, cols,
                              D);
        std::fill(dkt_acc, dkt_acc + 2 * block, 0.0f);
        const int64_t key_row = b * shape.kv_batch_stride + j0 * shape.k_row_stride + kvh * D;
        // The block's dK and dV rows are taken for writing during its first query block's
        // softmax, a key row per query row: all at once, just before they are written, their
        // lines stalled the core (a tenth of this kernel's time).
        int64_t prefetched = 0;

        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* lse_head = lse + (b * Hq + h) * Tq;
          for (int64_t i0 = first_query / kBlockQ * kBlockQ; i0 < Tq; i0 += kBlockQ) {
            const int64_t rows = std::min(kBlockQ, Tq - i0), rows_p = round_up(rows, 32);
            amx_gemm(rows_p, cols_p, Dp, q_rows_b + g * head_panel + i0 * Dp, Dp, kt_vnni,
                     2 * kBlockK, s_buf, kBlockK, false);
            amx_gemm(rows_p, cols_p, Dp, do_rows_b + g * head_panel + i0 * Dp, Dp, vt_vnni,
                     2 * kBlockK, dp_buf, kBlockK, false);
            // Row pairs: P = exp(S * scale - lse), dS = P * (dP - D_i) * scale, zero where masked
            // and on padding rows; dS as bf16 rows, P and dS as interleaved row pairs.
            const bool first_pass = g == 0 && i0 == first_query / kBlockQ * kBlockQ;
            for (int64_t r = 0; r < rows_p; r += 2) {
              if (first_pass && r < cols) {
                const int64_t keys = std::min<int64_t>(2, cols - r);
                prefetch_rows_for_writing(grads.dk + key_row + r * shape.k_row_stride,
                                          shape.k_row_stride, keys, D);
                prefetch_rows_for_writing(grads.dv + key_row + r * shape.v_row_stride,
                                          shape.v_row_stride, keys, D);
              }
              f32x16 p[2][kBlockK / kLanes] = {}, ds[2][kBlockK / kLanes] = {};
              for (int e = 0; e < 2; ++e) {
                const int64_t row = r + e;
                if (row >= rows) continue;
                const int64_t visible =
                    std::clamp<int64_t>(causal_offset + i0 + row - j0 + 1, 0, cols);
                const f32x16 visible_v = splat(static_cast<float>(visible));
                const float row_lse = lse_head[i0 + row], row_delta = delta[g * Tq + i0 + row];
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
            if (first_pass) prefetched = std::min(cols, rows_p);
            // dQ_i += dS K_j; dV_j^T += dO_i^T P; dK_j^T += Q_i^T dS.
            amx_gemm(rows_p, Dp, cols_p, ds_b, kBlockK, k_vnni, 2 * Dp,
                     dq_acc + g * head_panel + i0 * Dp, Dp, true);
            amx_gemm(Dp, cols_p, rows_p, do_t + g * head_panel + i0, Tp, p_vnni, 2 * kBlockK,
                     dvt_acc, kBlockK, true);
            amx_gemm(Dp, cols_p, rows_p, q_t + g * head_panel + i0, Tp, ds_vnni, 2 * kBlockK,
                     dkt_acc, kBlockK, true);
          }
        }
        write_transposed(grads.dk + key_row, shape.k_row_stride, dkt_acc, cols, D,
                         sums_wanted ? dk_sums : nullptr, prefetched);
        write_transposed(grads.dv + key_row, shape.v_row_stride, dvt_acc, cols, D,
                         sums_wanted ? dv_sums : nullptr, prefetched);
      }
      if (sums_wanted) {
        store_column_sums(grads.dk_sums + b * grads.sums_batch_stride + kvh * D, dk_sums, D);
        store_column_sums(grads.dv_sums + b * grads.sums_batch_stride + kvh * D, dv_sums, D);
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        if (sums_wanted) std::fill(dq_sums, dq_sums + Dp, 0.0);
        if constexpr (std::is_same_v<Grads, Fp32GradientRows>) {
          if (grads.accumulate_dq) {
            add_rows(grads.dq + b * shape.q_batch_stride + h * D, shape.q_row_stride,
                     dq_acc + g * head_panel, Dp, Tq, D);
            continue;
          }
        }
        write_rows(grads.dq + b * shape.q_batch_stride + h * D, shape.q_row_stride,
                   dq_acc + g * head_panel, Dp, Tq, D, sums_wanted ? dq_sums : nullptr);
        if (sums_wanted)
          store_column_sums(grads.dq_sums + b * grads.sums_batch_stride + h * D, dq_sums, D);
      }
    }
  }
}

}  // namespace

void attention_backward_amx(const Fp32GradientRows& grads, const float* d_out, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const AttentionShape& shape) {
  backward_amx(grads, d_out, q, k, v, out, lse, shape);
}

void attention_backward_amx(const AttentionGradientsBf16& grads, const float* d_out,
                            const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                            const float* out, const float* lse, const AttentionShape& shape) {
  backward_amx(grads, d_out, q, k, v, out, lse, shape);
}

}  // namespace lattice::kernels::attention_detail
#endif  // LATTICE_HAS_AMX
