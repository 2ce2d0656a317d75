// The portable attention path: FlashAttention-2 tiles on the fp32 micro-GEMM of
// attention_tiles.hpp (vector extensions, no ISA-specific intrinsics). Precision::fp32 computes in
// fp32; Precision::bf16 rounds q, k, v, d_out, P and dS to bf16 before the products they feed and
// keeps fp32 accumulation and softmax statistics (the AMX path's arithmetic, on fp32 units).
//
// Every path takes value heads of their own width (AttentionShape::value_dim) and the sliding
// window: a row's visible columns are [window start, causal end), and key blocks (forward) or query
// blocks (backward) wholly outside every row's window are skipped.
//
// Threading: forward tasks are (batch, kv head, chunk of query blocks); backward tasks are (batch,
// kv head), each owning the dk/dv of its kv head and the dq of its query-head group, so nothing
// races and the result does not depend on the thread count (bitwise).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <omp.h>

#include "lattice/kernels/cpu/attention_paths.hpp"
#include "lattice/kernels/cpu/attention_tiles.hpp"

namespace lattice::kernels::attention_detail {

void attention_forward_portable(float* out, float* lse, const float* q, const float* k,
                                const float* v, const AttentionShape& shape, Precision precision) {
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, kLanes);
  const int64_t Dv = shape.value_dim(), Dvp = round_up(Dv, kLanes);
  const int64_t group = Hq / Hkv;
  const int64_t causal_offset = attention_detail::causal_offset(shape);  // sees keys <= it + i
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
    // Per thread: K^T panel [key block][Dp][kForwardBlockK], V panel [key][Dvp], Q tile, S/P tile,
    // output accumulator, row max and row sum.
    const int64_t kt_panel_size = key_blocks * Dp * kForwardBlockK,
                  v_panel_size = key_blocks * kForwardBlockK * Dvp;
    const int64_t q_tile = kBlockQ * Dp, s_tile = kBlockQ * kForwardBlockK, o_tile = kBlockQ * Dvp;
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
      // Keys [0, keys) are seen by some row of the chunk (its last block sees the most).
      const int64_t keys =
          std::clamp<int64_t>(causal_offset + std::min(Tq, (last_qb + 1) * kBlockQ), 0, Tk);
      const float* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const float* v_src = v + b * shape.value_batch_stride() + kvh * Dv;
      for (int64_t j0 = 0; j0 < keys; j0 += kForwardBlockK)
        pack_transposed(kt_panel + j0 * Dp, kForwardBlockK, Dp, k_src + j0 * shape.k_row_stride,
                        shape.k_row_stride, std::min(kForwardBlockK, keys - j0), D, to_bf16);
      pack_rows(v_panel, Dvp, v_src, shape.v_row_stride, keys, Dv, to_bf16);
      std::fill(v_panel + keys * Dvp, v_panel + round_up(keys, kLanes) * Dvp, 0.0f);

      for (int64_t qb = last_qb; qb >= 0; qb -= chunks) {
        const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
        // Keys [0, key_end) are seen by some row of the block.
        const int64_t key_end = std::clamp<int64_t>(causal_offset + i0 + rows, 0, Tk);
        // Under a sliding window the block's first row sees nothing before key_begin: the key
        // blocks wholly before it are skipped.
        const int64_t key_begin =
            std::clamp<int64_t>(window_start(shape, causal_offset, i0), 0, key_end) /
            kForwardBlockK * kForwardBlockK;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          float* out_rows = out + (b * Tq + i0) * Hq * Dv + h * Dv;
          prefetch_rows_for_writing(out_rows, Hq * Dv, rows,
                                    Dv);  // arrive while the block computes
          pack_rows(q_pack, Dp, q + b * shape.q_batch_stride + i0 * shape.q_row_stride + h * D,
                    shape.q_row_stride, rows, D, to_bf16);
          std::fill(o_acc, o_acc + rows * Dvp, 0.0f);
          std::fill(row_max, row_max + rows, neg_inf);
          std::fill(row_sum, row_sum + rows, 0.0f);

          for (int64_t j0 = key_begin; j0 < key_end; j0 += kForwardBlockK) {
            const int64_t cols = std::min(kForwardBlockK, key_end - j0);
            const float* kt_block = kt_panel + j0 * Dp;
            const float* v_block = v_panel + j0 * Dvp;
            // One register-block of rows at a time: S = Q K^T, online softmax, O += P V. On the
            // diagonal the group's last row sees the most keys; columns no row sees are skipped.
            for (int64_t m0 = 0; m0 < rows; m0 += kMicroRows) {
              const int64_t group_rows = std::min<int64_t>(kMicroRows, rows - m0);
              const int64_t group_visible =
                  std::min(cols, causal_offset + i0 + m0 + group_rows - j0);
              // The group's first row's window starts first: when it starts past the block, no
              // row of the group sees the block.
              if (group_visible <= 0 || window_start(shape, causal_offset, i0 + m0) - j0 >= cols)
                continue;
              const int64_t n_eff = round_up(group_visible, kLanes);
              float* s_rows = s_buf + m0 * kForwardBlockK;
              gemm_rows(group_rows, n_eff, Dp, q_pack + m0 * Dp, Dp, 1, kt_block, kForwardBlockK,
                        s_rows, kForwardBlockK, false);
              for (int64_t r = m0; r < m0 + group_rows; ++r) {
                float* s_row = s_buf + r * kForwardBlockK;
                // The row sees the block's columns [first_visible, visible).
                const int64_t visible = std::min(cols, causal_offset + i0 + r - j0 + 1);
                const int64_t first_visible =
                    std::max<int64_t>(window_start(shape, causal_offset, i0 + r) - j0, 0);
                if (visible <= first_visible) {
                  std::fill(s_row, s_row + n_eff, 0.0f);
                  continue;
                }
                const f32x16 visible_v = splat(static_cast<float>(visible));
                const f32x16 first_v = splat(static_cast<float>(first_visible));
                f32x16 max_v = splat(neg_inf);
                for (int64_t c = 0; c < n_eff; c += kLanes) {
                  f32x16 sv = load(s_row + c) * scale;
                  const f32x16 column = lane_index + static_cast<float>(c);
                  sv = column < visible_v && column >= first_v ? sv : splat(neg_inf);
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
                  float* o_row = o_acc + r * Dvp;
                  for (int64_t d = 0; d < Dvp; d += kLanes)
                    store(o_row + d, load(o_row + d) * alpha);
                }
              }
              gemm_rows(group_rows, Dvp, group_visible, s_rows, kForwardBlockK, 1, v_block, Dvp,
                        o_acc + m0 * Dvp, Dvp, true);
            }
          }

          float* lse_rows = lse + (b * Hq + h) * Tq + i0;
          for (int64_t r = 0; r < rows; ++r) {
            if (row_sum[r] == 0.0f) {  // the row saw no key (row_sum >= 1 once it sees one)
              std::fill(out_rows + r * Hq * Dv, out_rows + r * Hq * Dv + Dv, 0.0f);
              lse_rows[r] = neg_inf;
              continue;
            }
            const float inv_sum = 1.0f / row_sum[r];
            for (int64_t d = 0; d < Dv; ++d)
              out_rows[r * Hq * Dv + d] = o_acc[r * Dvp + d] * inv_sum;
            lse_rows[r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  }
}

void attention_backward_portable(float* dq, float* dk, float* dv, const float* d_out,
                                 const float* q, const float* k, const float* v, const float* out,
                                 const float* lse, const AttentionShape& shape, Precision precision,
                                 bool accumulate_dq) {
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, kLanes);
  const int64_t Dv = shape.value_dim(), Dvp = round_up(Dv, kLanes);
  const int64_t group = Hq / Hkv;
  const int64_t causal_offset = attention_detail::causal_offset(shape);  // sees keys <= it + i
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool to_bf16 = precision == Precision::bf16;
  const int64_t tasks = B * Hkv;
  const int64_t out_row = Hq * Dv;  // out and d_out are [B, Tq, Hq*Dv] contiguous
  const f32x16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

#pragma omp parallel
  {
    // Per thread, for one (batch, kv head): packed Q, dO and dQ accumulator of the whole query-head
    // group, D_i = rowsum(dO * O) per query, packed K block (rows and transposed), V^T block, dK
    // and dV block accumulators, and the P and dS tiles.
    const int64_t group_panel = group * Tq * Dp, value_panel = group * Tq * Dvp;
    const int64_t block_rows = kBlockK * Dp, value_rows = kBlockK * Dvp, tile = kBlockQ * kBlockK;
    Scratch<float> scratch(2 * group_panel + value_panel + group * Tq + 3 * block_rows +
                           2 * value_rows + 2 * tile);
    float* q_pack = scratch.get();
    float* do_pack = q_pack + group_panel;
    float* dq_acc = do_pack + value_panel;
    float* delta = dq_acc + group_panel;
    float* k_pack = delta + group * Tq;
    float* kt_pack = k_pack + block_rows;
    float* vt_pack = kt_pack + block_rows;
    float* dk_acc = vt_pack + value_rows;
    float* dv_acc = dk_acc + block_rows;
    float* p_buf = dv_acc + value_rows;
    float* ds_buf = p_buf + tile;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        pack_rows(q_pack + g * Tq * Dp, Dp, q + b * shape.q_batch_stride + h * D,
                  shape.q_row_stride, Tq, D, to_bf16);
        pack_rows(do_pack + g * Tq * Dvp, Dvp, d_out + b * Tq * out_row + h * Dv, out_row, Tq, Dv,
                  to_bf16);
        for (int64_t t = 0; t < Tq; ++t) {
          const float* o_row = out + (b * Tq + t) * out_row + h * Dv;
          const float* do_row = d_out + (b * Tq + t) * out_row + h * Dv;
          delta[g * Tq + t] = dot_product(do_row, o_row, Dv);
        }
      }
      std::fill(dq_acc, dq_acc + group_panel, 0.0f);
      const float* k_src = k + b * shape.kv_batch_stride + kvh * D;
      const float* v_src = v + b * shape.value_batch_stride() + kvh * Dv;

      for (int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, Tk - j0), cols_p = round_up(cols, kLanes);
        // Query rows from first_query on see key j0 or later ones of the block.
        const int64_t first_query = std::clamp<int64_t>(j0 - causal_offset, 0, Tq);
        // Under a sliding window, rows from end_query on see only keys after the block.
        const int64_t end_query =
            shape.window > 0
                ? std::clamp<int64_t>(j0 + cols - 1 - causal_offset + shape.window, 0, Tq)
                : Tq;
        pack_rows(k_pack, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride, cols, D,
                  to_bf16);
        pack_transposed(kt_pack, kBlockK, Dp, k_src + j0 * shape.k_row_stride, shape.k_row_stride,
                        cols, D, to_bf16);
        pack_transposed(vt_pack, kBlockK, Dvp, v_src + j0 * shape.v_row_stride, shape.v_row_stride,
                        cols, Dv, to_bf16);
        std::fill(dk_acc, dk_acc + cols * Dp, 0.0f);
        std::fill(dv_acc, dv_acc + cols * Dvp, 0.0f);
        float* dk_rows = dk + b * shape.kv_batch_stride + j0 * shape.k_row_stride + kvh * D;
        float* dv_rows = dv + b * shape.value_batch_stride() + j0 * shape.v_row_stride + kvh * Dv;
        // The rows' lines arrive while the block computes.
        prefetch_rows_for_writing(dk_rows, shape.k_row_stride, cols, D);
        prefetch_rows_for_writing(dv_rows, shape.v_row_stride, cols, Dv);

        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* lse_head = lse + (b * Hq + h) * Tq;
          // Query blocks that see some key of the block: those ending after first_query.
          for (int64_t i0 = first_query / kBlockQ * kBlockQ; i0 < end_query; i0 += kBlockQ) {
            const int64_t rows = std::min(kBlockQ, Tq - i0);
            const float* q_rows = q_pack + (g * Tq + i0) * Dp;
            const float* do_rows = do_pack + (g * Tq + i0) * Dvp;
            // Row groups: S = Q K^T and dP = dO V^T on the columns the group sees, then
            // P = exp(S * scale - lse) and dS = P * (dP - D_i) * scale (zero where masked), then
            // dQ_i += dS K_j.
            for (int64_t m0 = 0; m0 < rows; m0 += kMicroRows) {
              const int64_t group_rows = std::min<int64_t>(kMicroRows, rows - m0);
              const int64_t group_visible =
                  std::min(cols, causal_offset + i0 + m0 + group_rows - j0);
              if (group_visible <= 0) continue;
              const int64_t n_eff = round_up(group_visible, kLanes);
              gemm_rows(group_rows, n_eff, Dp, q_rows + m0 * Dp, Dp, 1, kt_pack, kBlockK,
                        p_buf + m0 * kBlockK, kBlockK, false);
              gemm_rows(group_rows, n_eff, Dvp, do_rows + m0 * Dvp, Dvp, 1, vt_pack, kBlockK,
                        ds_buf + m0 * kBlockK, kBlockK, false);
              for (int64_t r = m0; r < m0 + group_rows; ++r) {
                // The row sees the block's columns [first_visible, visible).
                const int64_t visible =
                    std::clamp<int64_t>(causal_offset + i0 + r - j0 + 1, 0, cols);
                const int64_t first_visible =
                    std::max<int64_t>(window_start(shape, causal_offset, i0 + r) - j0, 0);
                float* p_row = p_buf + r * kBlockK;
                float* ds_row = ds_buf + r * kBlockK;
                const float row_lse = lse_head[i0 + r], row_delta = delta[g * Tq + i0 + r];
                const f32x16 visible_v = splat(static_cast<float>(visible));
                const f32x16 first_v = splat(static_cast<float>(first_visible));
                for (int64_t c = 0; c < n_eff; c += kLanes) {
                  const f32x16 column = lane_index + static_cast<float>(c);
                  const i32x16 keep = column < visible_v && column >= first_v;
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
                        Dp, dq_acc + (g * Tq + i0 + m0) * Dp, Dp, true);
            }
            // Column groups: dV_j += P^T dO_i and dK_j += dS^T Q_i over the rows that see them.
            for (int64_t c0 = 0; c0 < cols; c0 += kMicroRows) {
              const int64_t group_cols = std::min<int64_t>(kMicroRows, cols - c0);
              const int64_t first_row = std::clamp<int64_t>(j0 + c0 - causal_offset - i0, 0, rows);
              if (first_row >= rows) continue;
              gemm_rows(group_cols, Dvp, rows - first_row, p_buf + first_row * kBlockK + c0, 1,
                        kBlockK, do_rows + first_row * Dvp, Dvp, dv_acc + c0 * Dvp, Dvp, true);
              gemm_rows(group_cols, Dp, rows - first_row, ds_buf + first_row * kBlockK + c0, 1,
                        kBlockK, q_rows + first_row * Dp, Dp, dk_acc + c0 * Dp, Dp, true);
            }
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          std::memcpy(dk_rows + c * shape.k_row_stride, dk_acc + c * Dp,
                      static_cast<size_t>(D) * sizeof(float));
          std::memcpy(dv_rows + c * shape.v_row_stride, dv_acc + c * Dvp,
                      static_cast<size_t>(Dv) * sizeof(float));
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        float* dq_rows = dq + b * shape.q_batch_stride + h * D;
        prefetch_rows_for_writing(dq_rows, shape.q_row_stride, std::min(Tq, kRowsWrittenAhead), D);
        for (int64_t t = 0; t < Tq; ++t) {
          if (t + kRowsWrittenAhead < Tq)
            prefetch_rows_for_writing(dq_rows + (t + kRowsWrittenAhead) * shape.q_row_stride,
                                      shape.q_row_stride, 1, D);
          float* dq_row = dq_rows + t * shape.q_row_stride;
          const float* acc_row = dq_acc + (g * Tq + t) * Dp;
          if (accumulate_dq) {
            for (int64_t d = 0; d < D; ++d) dq_row[d] += acc_row[d];
          } else {
            std::memcpy(dq_row, acc_row, static_cast<size_t>(D) * sizeof(float));
          }
        }
      }
    }
  }
}

}  // namespace lattice::kernels::attention_detail
