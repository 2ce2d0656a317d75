// Ring attention: see ring_attention.hpp.
#include "lattice/parallel/context/ring_attention.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <utility>

#include "lattice/parallel/context/row_copies.hpp"
#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {

namespace k = lattice::kernels;
using model::PositionRun;

namespace {

constexpr int kKeyValueTag = 2301;  // a key/value block moving one hop
constexpr int kGradientTag = 2302;  // a block's key/value gradient summed so far

// The call over query run `q` and key run `kv` of a block laid out [batch, n, width] (k and v
// contiguous per token), with the local shape's query strides; nullopt when the mask hides every
// key of the run from every query (all its keys after the last query).
std::optional<k::AttentionShape> pair_shape(const k::AttentionShape& local, const PositionRun& q,
                                            const PositionRun& kv) {
  if (kv.position > q.position + q.length - 1) return std::nullopt;
  k::AttentionShape s = local;
  const int64_t width = local.kv_heads * local.head_dim;
  s.q_len = q.length;
  s.kv_len = kv.length;
  s.k_row_stride = s.v_row_stride = width;
  s.kv_batch_stride = local.kv_len * width;
  s.q_offset = q.position;
  s.k_offset = kv.position;
  // Keys wholly before every query need no mask (the same result, less work).
  s.mask =
      kv.position + kv.length - 1 <= q.position ? k::AttentionMask::none : k::AttentionMask::causal;
  return s;
}

}  // namespace

RingAttention::RingAttention(comm::Communicator& cp, MemoryTracker* tracker)
    : cp_(cp), tracker_(tracker) {}

std::vector<PositionRun> RingAttention::runs(int64_t local_len) const {
  return balanced_runs(local_len, cp_.size(), cp_.rank());
}

void RingAttention::wait(comm::CommHandle& handle) {
  const auto start = std::chrono::steady_clock::now();
  handle.wait();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double RingAttention::take_wait_seconds() {
  return std::exchange(wait_seconds_, 0.0);
}

void RingAttention::forward(k::Ops& ops, float* out, float* lse, const float* q, const float* k,
                            const float* v, const k::AttentionShape& local,
                            k::Precision precision) {
  const int P = cp_.size(), me = cp_.rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  const int64_t B = local.batch, n = local.q_len, H = local.q_heads, D = local.head_dim;
  const int64_t width = local.kv_heads * D, block = 2 * B * n * width;
  // Two key/value blocks [k | v], each [B, n, width]: the one in hand and the one arriving.
  Tensor blocks[2] = {context_buffer(block, tracker_), context_buffer(block, tracker_)};
  pack_rows(blocks[0].f32(), k, B, 0, n, width, local.k_row_stride, local.kv_batch_stride);
  pack_rows(blocks[0].f32() + B * n * width, v, B, 0, n, width, local.v_row_stride,
            local.kv_batch_stride);
  const std::vector<PositionRun> mine = runs(n);
  // Per query run: the running out [B, len, H·D] and lse [B, H, len] (-inf: no key yet).
  std::vector<Tensor> run_out, run_lse;
  for (const PositionRun& r : mine) {
    run_out.push_back(context_buffer(B * r.length * H * D, tracker_));
    run_lse.push_back(context_buffer(B * H * r.length, tracker_));
    float* l = run_lse.back().f32();
    std::fill(l, l + B * H * r.length, -std::numeric_limits<float>::infinity());
  }
  Tensor part_out = context_buffer(B * n * H * D, tracker_),
         part_lse = context_buffer(B * H * n, tracker_);
  for (int step = 0; step < P; ++step) {
    const float* held = blocks[step % 2].f32();
    comm::CommHandle sent, received;
    if (step + 1 < P) {  // the next block travels while this one is computed
      received = cp_.irecv(blocks[(step + 1) % 2].f32(), block, DType::f32, prev, kKeyValueTag);
      sent = cp_.isend(held, block, DType::f32, next, kKeyValueTag);
    }
    const int source = (me - step + P) % P;
    for (size_t i = 0; i < mine.size(); ++i)
      for (const PositionRun& kv : balanced_runs(n, P, source)) {
        const std::optional<k::AttentionShape> s = pair_shape(local, mine[i], kv);
        if (!s) continue;
        ops.attention_forward(part_out.f32(), part_lse.f32(), q + mine[i].row * local.q_row_stride,
                              held + kv.row * width, held + B * n * width + kv.row * width, *s,
                              precision, {});
        ops.attention_merge_partial(run_out[i].f32(), run_lse[i].f32(), part_out.f32(),
                                    part_lse.f32(), B, mine[i].length, H, D);
      }
    wait(received);
    wait(sent);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    unpack_rows(out, run_out[i].f32(), B, mine[i].row, mine[i].length, H * D, H * D, n * H * D);
    unpack_columns(lse, run_lse[i].f32(), B, H, n, mine[i].row, mine[i].length);
  }
}

void RingAttention::backward(k::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                             const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const k::AttentionShape& local,
                             k::Precision precision) {
  const int P = cp_.size(), me = cp_.rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  const int64_t B = local.batch, n = local.q_len, H = local.q_heads, D = local.head_dim;
  const int64_t width = local.kv_heads * D, half = B * n * width, block = 2 * half;
  Tensor blocks[2] = {context_buffer(block, tracker_), context_buffer(block, tracker_)};
  pack_rows(blocks[0].f32(), k, B, 0, n, width, local.k_row_stride, local.kv_batch_stride);
  pack_rows(blocks[0].f32() + half, v, B, 0, n, width, local.v_row_stride, local.kv_batch_stride);
  // The kernel reads out, d_out and lse of the queries it is given contiguously: one copy per run.
  const std::vector<PositionRun> mine = runs(n);
  std::vector<Tensor> run_out, run_d_out, run_lse;
  for (const PositionRun& r : mine) {
    run_out.push_back(context_buffer(B * r.length * H * D, tracker_));
    run_d_out.push_back(context_buffer(B * r.length * H * D, tracker_));
    run_lse.push_back(context_buffer(B * H * r.length, tracker_));
    pack_rows(run_out.back().f32(), out, B, r.row, r.length, H * D, H * D, n * H * D);
    pack_rows(run_d_out.back().f32(), d_out, B, r.row, r.length, H * D, H * D, n * H * D);
    pack_columns(run_lse.back().f32(), lse, B, H, n, r.row, r.length);
  }
  // dq accumulates over every block (zeroed here, strided like q).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      ops.fill_zero(dq + b * local.q_batch_stride + t * local.q_row_stride, H * D);
  // Gradients [dk | dv] laid out as a block: one call's (overwritten per call), this rank's sum
  // for the block in hand (two, alternating, while the previous one is still being sent), and the
  // sum arriving from the previous rank.
  Tensor call = context_buffer(block, tracker_), incoming = context_buffer(block, tracker_);
  Tensor sums[2] = {context_buffer(block, tracker_), context_buffer(block, tracker_)};
  comm::CommHandle sum_sent[2];
  comm::CommHandle sum_received;
  k::AttentionOptions accumulate;
  accumulate.accumulate_dq = true;
  for (int step = 0; step < P; ++step) {
    const float* held = blocks[step % 2].f32();
    comm::CommHandle sent, received;
    if (step + 1 < P) {
      received = cp_.irecv(blocks[(step + 1) % 2].f32(), block, DType::f32, prev, kKeyValueTag);
      sent = cp_.isend(held, block, DType::f32, next, kKeyValueTag);
    }
    if (step > 0)  // the block's gradient from the ranks it has visited, sent after their step
      sum_received = cp_.irecv(incoming.f32(), block, DType::f32, prev, kGradientTag);
    Tensor& sum = sums[step % 2];
    wait(sum_sent[step % 2]);  // its previous contents have left
    ops.fill_zero(sum.f32(), block);
    const int source = (me - step + P) % P;
    for (const PositionRun& kv : balanced_runs(n, P, source))
      for (size_t i = 0; i < mine.size(); ++i) {
        const std::optional<k::AttentionShape> s = pair_shape(local, mine[i], kv);
        if (!s) continue;
        const int64_t at = kv.row * width;
        ops.attention_backward(dq + mine[i].row * local.q_row_stride, call.f32() + at,
                               call.f32() + half + at, run_d_out[i].f32(),
                               q + mine[i].row * local.q_row_stride, held + at, held + half + at,
                               run_out[i].f32(), run_lse[i].f32(), *s, precision, accumulate);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t part : {int64_t{0}, half}) {
            const int64_t offset = part + b * n * width + at;
            ops.add_inplace(sum.f32() + offset, call.f32() + offset, kv.length * width);
          }
      }
    if (step > 0) {
      wait(sum_received);
      ops.add_inplace(sum.f32(), incoming.f32(), block);
    }
    // On to the next rank; after the last step that is the block's owner (source + 1 = next).
    sum_sent[step % 2] = cp_.isend(sum.f32(), block, DType::f32, next, kGradientTag);
    wait(received);
    wait(sent);
  }
  // This rank's own block comes home with every rank's contribution.
  sum_received = cp_.irecv(incoming.f32(), block, DType::f32, prev, kGradientTag);
  wait(sum_received);
  wait(sum_sent[0]);
  wait(sum_sent[1]);
  unpack_rows(dk, incoming.f32(), B, 0, n, width, local.k_row_stride, local.kv_batch_stride);
  unpack_rows(dv, incoming.f32() + half, B, 0, n, width, local.v_row_stride, local.kv_batch_stride);
}

}  // namespace lattice::parallel
