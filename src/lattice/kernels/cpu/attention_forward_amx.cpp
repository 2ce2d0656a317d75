// The bf16 attention forward on AMX tiles (ISA-specific: AMX, AVX-512): the same tasks, tiles and
// fp32 online softmax as the portable forward, with bf16 q, k, v and P multiplied by tdpbf16ps.
// Serves attention_forward with Precision::bf16 (fp32 inputs rounded as they are packed) and
// attention_forward_bf16 (bf16 inputs as they are).
#include "lattice/kernels/cpu/attention_amx_tiles.hpp"

#if defined(LATTICE_HAS_AMX)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <omp.h>

#include "lattice/kernels/cpu/attention_paths.hpp"

namespace lattice::kernels::attention_detail {
namespace {

// Forward with bf16 q, k, v, P on AMX (any mask and offsets); same tasks, tiles and online softmax
// (fp32) as the fp32 path. Tiles are padded to multiples of 32 rows, keys and head_dim with zeros.
template <class Src>
void forward_amx(float* out, float* lse, const Src* q, const Src* k, const Src* v,
                 const AttentionShape& shape) {
  const int64_t B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, Hq = shape.q_heads;
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, Dp = round_up(D, 32);
  const int64_t group = Hq / Hkv;
  const int64_t causal_offset = attention_detail::causal_offset(shape);  // sees keys <= it + i
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
      // Keys [0, keys) are seen by some row of the chunk (its last block sees the most).
      const int64_t keys =
          std::clamp<int64_t>(causal_offset + std::min(Tq, (last_qb + 1) * kBlockQ), 0, Tk);
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
        const int64_t key_end = std::clamp<int64_t>(causal_offset + i0 + rows, 0, Tk);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          float* out_rows = out + (b * Tq + i0) * Hq * D + h * D;
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
              // The output rows taken for writing, one per row of the first key block's softmax:
              // they arrive while the block computes, and spread out they do not stall the core
              // as the block's 256 lines asked for at once did (15% of this kernel's time).
              if (j0 == 0) prefetch_rows_for_writing(out_rows + r * Hq * D, Hq * D, 1, D);
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

          float* lse_rows = lse + (b * Hq + h) * Tq + i0;
          for (int64_t r = 0; r < rows; ++r) {
            if (row_sum[r] == 0.0f) {  // the row saw no key (row_sum >= 1 once it sees one)
              std::fill(out_rows + r * Hq * D, out_rows + r * Hq * D + D, 0.0f);
              lse_rows[r] = neg_inf;
              continue;
            }
            const float inv_sum = 1.0f / row_sum[r];
            for (int64_t d = 0; d < D; ++d) out_rows[r * Hq * D + d] = o_acc[r * Dp + d] * inv_sum;
            lse_rows[r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  }
}

}  // namespace

void attention_forward_amx(float* out, float* lse, const float* q, const float* k, const float* v,
                           const AttentionShape& shape) {
  forward_amx(out, lse, q, k, v, shape);
}

void attention_forward_amx(float* out, float* lse, const lattice::bf16* q, const lattice::bf16* k,
                           const lattice::bf16* v, const AttentionShape& shape) {
  forward_amx(out, lse, q, k, v, shape);
}

}  // namespace lattice::kernels::attention_detail
#endif  // LATTICE_HAS_AMX
