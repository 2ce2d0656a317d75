// Ring attention: see ring_attention.hpp.
#include "lattice/parallel/context/ring_attention.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "lattice/parallel/context/row_copies.hpp"
#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {

namespace k = lattice::kernels;
using model::PositionRun;

namespace {

constexpr int kKeyValueTag = 2301;  // a key/value block moving one hop
constexpr int kGradientTag = 2302;  // a block's key/value gradient summed so far

// The call over query run `q` and key run `kv` of a block laid out [k | v] ([batch, n, kv_heads ·
// head_dim] then [batch, n, kv_heads · value_dim()], each contiguous per token), with the local
// shape's query strides; nullopt when the mask hides every key of the run from every query (all
// its keys after the last query, or before the first query's sliding window).
std::optional<k::AttentionShape> pair_shape(const k::AttentionShape& local, const PositionRun& q,
                                            const PositionRun& kv) {
  if (kv.position > q.position + q.length - 1) return std::nullopt;
  // Under a sliding window, keys wholly before the first query's window are seen by none.
  if (local.window > 0 && kv.position + kv.length - 1 < q.position - local.window + 1)
    return std::nullopt;
  k::AttentionShape s = local;
  const int64_t k_width = local.kv_heads * local.head_dim;
  const int64_t v_width = local.kv_heads * local.value_dim();
  s.q_len = q.length;
  s.kv_len = kv.length;
  s.k_row_stride = k_width;
  s.v_row_stride = v_width;
  s.kv_batch_stride = local.kv_len * k_width;
  s.v_batch_stride = local.kv_len * v_width;
  s.q_offset = q.position;
  s.k_offset = kv.position;
  // Keys wholly before every query need no mask (the same result, less work) unless a sliding
  // window hides the older ones.
  s.mask = local.window == 0 && kv.position + kv.length - 1 <= q.position
               ? k::AttentionMask::none
               : k::AttentionMask::causal;
  return s;
}

}  // namespace

RingAttention::Blocks RingAttention::own_blocks(k::Ops& ops, const float* k, const float* v,
                                                const k::AttentionShape& local,
                                                k::Precision precision) {
  const int64_t B = local.batch, n = local.q_len;
  const int64_t k_width = local.kv_heads * local.head_dim;
  const int64_t v_width = local.kv_heads * local.value_dim();
  const int64_t k_part = B * n * k_width, count = k_part + B * n * v_width;
  if (precision != k::Precision::bf16) {
    float* own = workspace_.slot(0, count);
    DeviceMemory& memory = workspace_.memory();
    pack_rows(memory, own, k, B, 0, n, k_width, local.k_row_stride, local.kv_batch_stride);
    pack_rows(memory, own + k_part, v, B, 0, n, v_width, local.v_row_stride,
              local.value_batch_stride());
    return {{own, workspace_.slot(1, count)}, count, DType::f32};
  }
  // bf16 elements in float slots: `count` of them take count / 2 floats (rounded up).
  const int64_t floats = (count + 1) / 2;
  auto* own = reinterpret_cast<lattice::bf16*>(workspace_.slot(0, floats));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) {
      ops.convert_to_bf16(own + (b * n + t) * k_width,
                          k + b * local.kv_batch_stride + t * local.k_row_stride, k_width);
      ops.convert_to_bf16(own + k_part + (b * n + t) * v_width,
                          v + b * local.value_batch_stride() + t * local.v_row_stride, v_width);
    }
  return {{own, workspace_.slot(1, floats)}, count, DType::bf16};
}

const float* RingAttention::held_fp32(k::Ops& ops, const Blocks& blocks, int index) {
  if (blocks.dtype == DType::f32) return static_cast<const float*>(blocks.data[index]);
  float* wide = workspace_.slot(14, blocks.count);
  ops.convert_to_f32(wide, static_cast<const lattice::bf16*>(blocks.data[index]), blocks.count);
  return wide;
}

void RingAttention::forward(k::Ops& ops, float* out, float* lse, const float* q, const float* k,
                            const float* v, const k::AttentionShape& local,
                            k::Precision precision) {
  const int P = cp_.size(), me = cp_.rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  const int64_t B = local.batch, n = local.q_len, H = local.q_heads, Dv = local.value_dim();
  const int64_t k_width = local.kv_heads * local.head_dim, v_width = local.kv_heads * Dv;
  const int64_t k_part = B * n * k_width;
  // Workspace slots (the backward uses 0-5 and 14 for the same things and 8-13 for its own): 0,
  // 1 the travelling key/value blocks (own_blocks); 2, 3 each query run's running out [B, len,
  // H·Dv]; 4, 5 its lse [B, H, len]; 6, 7 one call's out and lse; 14 the block in hand widened.
  const Blocks blocks = own_blocks(ops, k, v, local, precision);
  const std::vector<PositionRun> mine = runs(n);
  std::vector<float*> run_out, run_lse;
  int64_t longest = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    const int64_t len = mine[i].length;
    longest = std::max(longest, len);
    run_out.push_back(workspace_.slot(2 + i, B * len * H * Dv));
    run_lse.push_back(workspace_.slot(4 + i, B * H * len));
    ops.fill(run_lse.back(), B * H * len, -std::numeric_limits<float>::infinity());  // no key yet
  }
  float* part_out = workspace_.slot(6, B * longest * H * Dv);
  float* part_lse = workspace_.slot(7, B * H * longest);
  for (int step = 0; step < P; ++step) {
    comm::CommHandle sent, received;
    if (step + 1 < P) {  // the next block travels while this one is computed
      received =
          cp_.irecv(blocks.data[(step + 1) % 2], blocks.count, blocks.dtype, prev, kKeyValueTag);
      sent = cp_.isend(blocks.data[step % 2], blocks.count, blocks.dtype, next, kKeyValueTag);
    }
    const float* held = held_fp32(ops, blocks, step % 2);
    const int source = (me - step + P) % P;
    for (size_t i = 0; i < mine.size(); ++i)
      for (const PositionRun& kv : balanced_runs(n, P, source)) {
        const std::optional<k::AttentionShape> s = pair_shape(local, mine[i], kv);
        if (!s) continue;
        ops.attention_forward(part_out, part_lse, q + mine[i].row * local.q_row_stride,
                              held + kv.row * k_width, held + k_part + kv.row * v_width, *s,
                              precision, {});
        ops.attention_merge_partial(run_out[i], run_lse[i], part_out, part_lse, B, mine[i].length,
                                    H, Dv);
      }
    wait(received);
    wait(sent);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    unpack_rows(workspace_.memory(), out, run_out[i], B, mine[i].row, mine[i].length, H * Dv,
                H * Dv, n * H * Dv);
    unpack_columns(workspace_.memory(), lse, run_lse[i], B, H, n, mine[i].row, mine[i].length);
  }
}

void RingAttention::backward(k::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                             const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const k::AttentionShape& local,
                             k::Precision precision) {
  const int P = cp_.size(), me = cp_.rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  const int64_t B = local.batch, n = local.q_len, H = local.q_heads, D = local.head_dim;
  const int64_t Dv = local.value_dim();
  const int64_t k_width = local.kv_heads * D, v_width = local.kv_heads * Dv;
  const int64_t k_part = B * n * k_width, block = k_part + B * n * v_width;
  // Workspace slots: 0, 1 the key/value blocks as in the forward; 2, 3 each query run's out, 4, 5
  // its lse and 8, 9 its d_out (the kernel reads the queries' out, d_out and lse contiguously:
  // one copy per run); 10 one call's [dk | dv]; 11 the sum arriving from the previous rank; 12, 13
  // this rank's sums (two, alternating, while the previous one is still being sent); 14 the block
  // in hand widened (bf16).
  const Blocks blocks = own_blocks(ops, k, v, local, precision);
  const std::vector<PositionRun> mine = runs(n);
  std::vector<float*> run_out, run_d_out, run_lse;
  for (size_t i = 0; i < mine.size(); ++i) {
    const PositionRun& r = mine[i];
    run_out.push_back(workspace_.slot(2 + i, B * r.length * H * Dv));
    run_lse.push_back(workspace_.slot(4 + i, B * H * r.length));
    run_d_out.push_back(workspace_.slot(8 + i, B * r.length * H * Dv));
    DeviceMemory& memory = workspace_.memory();
    pack_rows(memory, run_out.back(), out, B, r.row, r.length, H * Dv, H * Dv, n * H * Dv);
    pack_rows(memory, run_d_out.back(), d_out, B, r.row, r.length, H * Dv, H * Dv, n * H * Dv);
    pack_columns(memory, run_lse.back(), lse, B, H, n, r.row, r.length);
  }
  // dq accumulates over every block (zeroed here, strided like q).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      ops.fill_zero(dq + b * local.q_batch_stride + t * local.q_row_stride, H * D);
  float* call = workspace_.slot(10, block);
  float* incoming = workspace_.slot(11, block);
  float* sums[2] = {workspace_.slot(12, block), workspace_.slot(13, block)};
  comm::CommHandle sum_sent[2];
  comm::CommHandle sum_received;
  k::AttentionOptions accumulate;
  accumulate.accumulate_dq = true;
  for (int step = 0; step < P; ++step) {
    comm::CommHandle sent, received;
    if (step + 1 < P) {
      received =
          cp_.irecv(blocks.data[(step + 1) % 2], blocks.count, blocks.dtype, prev, kKeyValueTag);
      sent = cp_.isend(blocks.data[step % 2], blocks.count, blocks.dtype, next, kKeyValueTag);
    }
    const float* held = held_fp32(ops, blocks, step % 2);
    if (step > 0)  // the block's gradient from the ranks it has visited, sent after their step
      sum_received = cp_.irecv(incoming, block, DType::f32, prev, kGradientTag);
    float* sum = sums[step % 2];
    wait(sum_sent[step % 2]);  // its previous contents have left
    ops.fill_zero(sum, block);
    const int source = (me - step + P) % P;
    for (const PositionRun& kv : balanced_runs(n, P, source))
      for (size_t i = 0; i < mine.size(); ++i) {
        const std::optional<k::AttentionShape> s = pair_shape(local, mine[i], kv);
        if (!s) continue;
        const int64_t k_at = kv.row * k_width, v_at = k_part + kv.row * v_width;
        ops.attention_backward(dq + mine[i].row * local.q_row_stride, call + k_at, call + v_at,
                               run_d_out[i], q + mine[i].row * local.q_row_stride, held + k_at,
                               held + v_at, run_out[i], run_lse[i], *s, precision, accumulate);
        for (int64_t b = 0; b < B; ++b) {
          const int64_t k_offset = b * n * k_width + k_at, v_offset = b * n * v_width + v_at;
          ops.add_inplace(sum + k_offset, call + k_offset, kv.length * k_width);
          ops.add_inplace(sum + v_offset, call + v_offset, kv.length * v_width);
        }
      }
    if (step > 0) {
      wait(sum_received);
      ops.add_inplace(sum, incoming, block);
    }
    // On to the next rank; after the last step that is the block's owner (source + 1 = next).
    sum_sent[step % 2] = cp_.isend(sum, block, DType::f32, next, kGradientTag);
    wait(received);
    wait(sent);
  }
  // This rank's own block comes home with every rank's contribution.
  sum_received = cp_.irecv(incoming, block, DType::f32, prev, kGradientTag);
  wait(sum_received);
  wait(sum_sent[0]);
  wait(sum_sent[1]);
  unpack_rows(workspace_.memory(), dk, incoming, B, 0, n, k_width, local.k_row_stride,
              local.kv_batch_stride);
  unpack_rows(workspace_.memory(), dv, incoming + k_part, B, 0, n, v_width, local.v_row_stride,
              local.value_batch_stride());
}

}  // namespace lattice::parallel
