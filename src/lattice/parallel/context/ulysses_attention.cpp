// Ulysses all-to-all attention: see ulysses_attention.hpp.
#include "lattice/parallel/context/ulysses_attention.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "lattice/core/error.hpp"
#include "lattice/parallel/context/row_copies.hpp"
#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {

namespace k = lattice::kernels;
using model::PositionRun;

UlyssesAttention::UlyssesAttention(comm::Communicator& cp, MemoryTracker* tracker)
    : cp_(cp), tracker_(tracker) {}

std::vector<PositionRun> UlyssesAttention::runs(int64_t local_len) const {
  return balanced_runs(local_len, cp_.size(), cp_.rank());
}

double UlyssesAttention::take_wait_seconds() {
  return std::exchange(wait_seconds_, 0.0);
}

void UlyssesAttention::check_heads(const k::AttentionShape& local) const {
  const int P = cp_.size();
  check(local.q_heads % P == 0 && local.kv_heads % P == 0,
        "context_parallel.mode = ulysses splits the attention heads over parallelism.cp = " +
            std::to_string(P) + " ranks, but this rank has " + std::to_string(local.q_heads) +
            " query and " + std::to_string(local.kv_heads) +
            " key/value heads: use context_parallel.mode = ring, or a cp dividing both");
}

void UlyssesAttention::exchange(const float* send, float* receive, int64_t block) {
  const auto start = std::chrono::steady_clock::now();
  cp_.all_to_all(send, receive, block, DType::f32);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void UlyssesAttention::to_heads(float* full, const float* x, int64_t B, int64_t n, int64_t heads,
                                int64_t D, int64_t row_stride, int64_t batch_stride) {
  const int P = cp_.size();
  const int64_t w = heads / P * D, block = B * n * w, T = n * P;
  Tensor send = context_buffer(P * block, tracker_), receive = context_buffer(P * block, tracker_);
  for (int j = 0; j < P; ++j)  // rank j's heads of this rank's rows
    pack_rows(send.f32() + j * block, x + j * w, B, 0, n, w, row_stride, batch_stride);
  exchange(send.f32(), receive.f32(), block);
  for (int s = 0; s < P; ++s)  // rank s's rows of this rank's heads, at their positions
    for (const PositionRun& run : balanced_runs(n, P, s))
      copy_rows(full + run.position * w, w, T * w, receive.f32() + s * block + run.row * w, w,
                n * w, B, run.length, w);
}

void UlyssesAttention::from_heads(float* x, const float* full, int64_t B, int64_t n, int64_t heads,
                                  int64_t D, int64_t row_stride, int64_t batch_stride) {
  const int P = cp_.size();
  const int64_t w = heads / P * D, block = B * n * w, T = n * P;
  Tensor send = context_buffer(P * block, tracker_), receive = context_buffer(P * block, tracker_);
  for (int j = 0; j < P; ++j)  // rank j's rows of this rank's heads
    for (const PositionRun& run : balanced_runs(n, P, j))
      copy_rows(send.f32() + j * block + run.row * w, w, n * w, full + run.position * w, w, T * w,
                B, run.length, w);
  exchange(send.f32(), receive.f32(), block);
  for (int s = 0; s < P; ++s)  // rank s's heads of this rank's rows
    unpack_rows(x + s * w, receive.f32() + s * block, B, 0, n, w, row_stride, batch_stride);
}

void UlyssesAttention::lse_to_heads(float* full, const float* lse, int64_t B, int64_t n,
                                    int64_t heads) {
  const int P = cp_.size();
  const int64_t h = heads / P, block = B * h * n, T = n * P;
  Tensor send = context_buffer(P * block, tracker_), receive = context_buffer(P * block, tracker_);
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(lse + (b * heads + j * h) * n, h * n, send.f32() + j * block + b * h * n);
  exchange(send.f32(), receive.f32(), block);
  for (int s = 0; s < P; ++s)
    for (const PositionRun& run : balanced_runs(n, P, s))
      for (int64_t bh = 0; bh < B * h; ++bh)
        std::copy_n(receive.f32() + s * block + bh * n + run.row, run.length,
                    full + bh * T + run.position);
}

void UlyssesAttention::lse_from_heads(float* lse, const float* full, int64_t B, int64_t n,
                                      int64_t heads) {
  const int P = cp_.size();
  const int64_t h = heads / P, block = B * h * n, T = n * P;
  Tensor send = context_buffer(P * block, tracker_), receive = context_buffer(P * block, tracker_);
  for (int j = 0; j < P; ++j)
    for (const PositionRun& run : balanced_runs(n, P, j))
      for (int64_t bh = 0; bh < B * h; ++bh)
        std::copy_n(full + bh * T + run.position, run.length,
                    send.f32() + j * block + bh * n + run.row);
  exchange(send.f32(), receive.f32(), block);
  for (int s = 0; s < P; ++s)
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(receive.f32() + s * block + b * h * n, h * n, lse + (b * heads + s * h) * n);
}

void UlyssesAttention::forward(k::Ops& ops, float* out, float* lse, const float* q, const float* k,
                               const float* v, const k::AttentionShape& local,
                               k::Precision precision) {
  check_heads(local);
  const int P = cp_.size();
  const int64_t B = local.batch, n = local.q_len, T = n * P, D = local.head_dim;
  const int64_t hq = local.q_heads / P, hkv = local.kv_heads / P;
  Tensor fq = context_buffer(B * T * hq * D, tracker_),
         fk = context_buffer(B * T * hkv * D, tracker_),
         fv = context_buffer(B * T * hkv * D, tracker_),
         fo = context_buffer(B * T * hq * D, tracker_), fl = context_buffer(B * hq * T, tracker_);
  to_heads(fq.f32(), q, B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  to_heads(fk.f32(), k, B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  to_heads(fv.f32(), v, B, n, local.kv_heads, D, local.v_row_stride, local.kv_batch_stride);
  ops.attention_forward(fo.f32(), fl.f32(), fq.f32(), fk.f32(), fv.f32(),
                        k::AttentionShape::contiguous(B, T, hq, hkv, D), precision, {});
  const int64_t width = local.q_heads * D;
  from_heads(out, fo.f32(), B, n, local.q_heads, D, width, n * width);
  lse_from_heads(lse, fl.f32(), B, n, local.q_heads);
}

void UlyssesAttention::backward(k::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                                const float* q, const float* k, const float* v, const float* out,
                                const float* lse, const k::AttentionShape& local,
                                k::Precision precision) {
  check_heads(local);
  const int P = cp_.size();
  const int64_t B = local.batch, n = local.q_len, T = n * P, D = local.head_dim;
  const int64_t hq = local.q_heads / P, hkv = local.kv_heads / P, width = local.q_heads * D;
  const int64_t q_size = B * T * hq * D, kv_size = B * T * hkv * D;
  Tensor fq = context_buffer(q_size, tracker_), fk = context_buffer(kv_size, tracker_),
         fv = context_buffer(kv_size, tracker_), fo = context_buffer(q_size, tracker_),
         fdo = context_buffer(q_size, tracker_), fl = context_buffer(B * hq * T, tracker_);
  to_heads(fq.f32(), q, B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  to_heads(fk.f32(), k, B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  to_heads(fv.f32(), v, B, n, local.kv_heads, D, local.v_row_stride, local.kv_batch_stride);
  to_heads(fo.f32(), out, B, n, local.q_heads, D, width, n * width);
  to_heads(fdo.f32(), d_out, B, n, local.q_heads, D, width, n * width);
  lse_to_heads(fl.f32(), lse, B, n, local.q_heads);
  // The gradients of this rank's head shard over the whole sequence.
  Tensor fdq = context_buffer(q_size, tracker_), fdk = context_buffer(kv_size, tracker_),
         fdv = context_buffer(kv_size, tracker_);
  ops.attention_backward(fdq.f32(), fdk.f32(), fdv.f32(), fdo.f32(), fq.f32(), fk.f32(), fv.f32(),
                         fo.f32(), fl.f32(), k::AttentionShape::contiguous(B, T, hq, hkv, D),
                         precision, {});
  from_heads(dq, fdq.f32(), B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  from_heads(dk, fdk.f32(), B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  from_heads(dv, fdv.f32(), B, n, local.kv_heads, D, local.v_row_stride, local.kv_batch_stride);
}

}  // namespace lattice::parallel
