// Ulysses all-to-all attention: see ulysses_attention.hpp.
#include "lattice/parallel/context/ulysses_attention.hpp"

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/parallel/context/row_copies.hpp"
#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {

namespace k = lattice::kernels;
using model::PositionRun;

namespace {

// Workspace slots: 0-4 q, k, v, out and lse over this rank's head shard (the whole sequence), 5-8
// d_out, dq, dk, dv likewise (backward), and the all-to-alls' send and receive buffers.
constexpr size_t kSend = 9, kReceive = 10;

}  // namespace

void UlyssesAttention::check_heads(const k::AttentionShape& local) const {
  const int P = cp_.size();
  check(local.q_heads % P == 0 && local.kv_heads % P == 0,
        "context_parallel.mode = ulysses splits the attention heads over parallelism.cp = " +
            std::to_string(P) + " ranks, but this rank has " + std::to_string(local.q_heads) +
            " query and " + std::to_string(local.kv_heads) +
            " key/value heads: use context_parallel.mode = ring, or a cp dividing both");
}

namespace {

// The whole-sequence call over this rank's heads: the local call's positions rule, mask, window
// and value width (v contiguous [B, T, hkv·value_dim()] in its own buffer).
k::AttentionShape full_sequence_shape(const k::AttentionShape& local, int64_t T, int64_t hq,
                                      int64_t hkv) {
  k::AttentionShape s = k::AttentionShape::contiguous(local.batch, T, hq, hkv, local.head_dim);
  s.mask = local.mask;
  s.window = local.window;
  if (local.value_dim() != local.head_dim) {
    s.v_head_dim = local.value_dim();
    s.v_row_stride = hkv * s.v_head_dim;
    s.v_batch_stride = T * s.v_row_stride;
  }
  return s;
}

}  // namespace

void UlyssesAttention::exchange(const float* send, float* receive, int64_t block) {
  waited([&] { cp_.all_to_all(send, receive, block, DType::f32); });
}

void UlyssesAttention::to_heads(float* full, const float* x, int64_t B, int64_t n, int64_t heads,
                                int64_t D, int64_t row_stride, int64_t batch_stride) {
  const int P = cp_.size();
  const int64_t w = heads / P * D, block = B * n * w, T = n * P;
  float* send = workspace_.slot(kSend, P * block);
  float* receive = workspace_.slot(kReceive, P * block);
  for (int j = 0; j < P; ++j)  // rank j's heads of this rank's rows
    pack_rows(workspace_.memory(), send + j * block, x + j * w, B, 0, n, w, row_stride,
              batch_stride);
  exchange(send, receive, block);
  for (int s = 0; s < P; ++s)  // rank s's rows of this rank's heads, at their positions
    for (const PositionRun& run : balanced_runs(n, P, s))
      copy_rows(workspace_.memory(), full + run.position * w, w, T * w,
                receive + s * block + run.row * w, w, n * w, B, run.length, w);
}

void UlyssesAttention::from_heads(float* x, const float* full, int64_t B, int64_t n, int64_t heads,
                                  int64_t D, int64_t row_stride, int64_t batch_stride) {
  const int P = cp_.size();
  const int64_t w = heads / P * D, block = B * n * w, T = n * P;
  float* send = workspace_.slot(kSend, P * block);
  float* receive = workspace_.slot(kReceive, P * block);
  for (int j = 0; j < P; ++j)  // rank j's rows of this rank's heads
    for (const PositionRun& run : balanced_runs(n, P, j))
      copy_rows(workspace_.memory(), send + j * block + run.row * w, w, n * w,
                full + run.position * w, w, T * w, B, run.length, w);
  exchange(send, receive, block);
  for (int s = 0; s < P; ++s)  // rank s's heads of this rank's rows
    unpack_rows(workspace_.memory(), x + s * w, receive + s * block, B, 0, n, w, row_stride,
                batch_stride);
}

void UlyssesAttention::lse_to_heads(float* full, const float* lse, int64_t B, int64_t n,
                                    int64_t heads) {
  const int P = cp_.size();
  const int64_t h = heads / P, block = B * h * n, T = n * P;
  float* send = workspace_.slot(kSend, P * block);
  float* receive = workspace_.slot(kReceive, P * block);
  // Rank j's heads of each sequence: B runs of h·n floats.
  for (int j = 0; j < P; ++j)
    copy_rows(workspace_.memory(), send + j * block, h * n, 0, lse + j * h * n, heads * n, 0, 1, B,
              h * n);
  exchange(send, receive, block);
  for (int s = 0; s < P; ++s)
    for (const PositionRun& run : balanced_runs(n, P, s))
      copy_rows(workspace_.memory(), full + run.position, T, 0, receive + s * block + run.row, n, 0,
                1, B * h, run.length);
}

void UlyssesAttention::lse_from_heads(float* lse, const float* full, int64_t B, int64_t n,
                                      int64_t heads) {
  const int P = cp_.size();
  const int64_t h = heads / P, block = B * h * n, T = n * P;
  float* send = workspace_.slot(kSend, P * block);
  float* receive = workspace_.slot(kReceive, P * block);
  for (int j = 0; j < P; ++j)
    for (const PositionRun& run : balanced_runs(n, P, j))
      copy_rows(workspace_.memory(), send + j * block + run.row, n, 0, full + run.position, T, 0, 1,
                B * h, run.length);
  exchange(send, receive, block);
  for (int s = 0; s < P; ++s)
    copy_rows(workspace_.memory(), lse + s * h * n, heads * n, 0, receive + s * block, h * n, 0, 1,
              B, h * n);
}

void UlyssesAttention::forward(k::Ops& ops, float* out, float* lse, const float* q, const float* k,
                               const float* v, const k::AttentionShape& local,
                               k::Precision precision) {
  check_heads(local);
  const int P = cp_.size();
  const int64_t B = local.batch, n = local.q_len, T = n * P, D = local.head_dim;
  const int64_t Dv = local.value_dim();
  const int64_t hq = local.q_heads / P, hkv = local.kv_heads / P;
  float* fq = workspace_.slot(0, B * T * hq * D);
  float* fk = workspace_.slot(1, B * T * hkv * D);
  float* fv = workspace_.slot(2, B * T * hkv * Dv);
  float* fo = workspace_.slot(3, B * T * hq * Dv);
  float* fl = workspace_.slot(4, B * hq * T);
  to_heads(fq, q, B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  to_heads(fk, k, B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  to_heads(fv, v, B, n, local.kv_heads, Dv, local.v_row_stride, local.value_batch_stride());
  ops.attention_forward(fo, fl, fq, fk, fv, full_sequence_shape(local, T, hq, hkv), precision, {});
  const int64_t width = local.q_heads * Dv;
  from_heads(out, fo, B, n, local.q_heads, Dv, width, n * width);
  lse_from_heads(lse, fl, B, n, local.q_heads);
}

void UlyssesAttention::backward(k::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                                const float* q, const float* k, const float* v, const float* out,
                                const float* lse, const k::AttentionShape& local,
                                k::Precision precision) {
  check_heads(local);
  const int P = cp_.size();
  const int64_t B = local.batch, n = local.q_len, T = n * P, D = local.head_dim;
  const int64_t Dv = local.value_dim();
  const int64_t hq = local.q_heads / P, hkv = local.kv_heads / P, width = local.q_heads * Dv;
  const int64_t q_size = B * T * hq * D, kv_size = B * T * hkv * D;
  const int64_t out_size = B * T * hq * Dv, v_size = B * T * hkv * Dv;
  float* fq = workspace_.slot(0, q_size);
  float* fk = workspace_.slot(1, kv_size);
  float* fv = workspace_.slot(2, v_size);
  float* fo = workspace_.slot(3, out_size);
  float* fl = workspace_.slot(4, B * hq * T);
  float* fdo = workspace_.slot(5, out_size);
  to_heads(fq, q, B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  to_heads(fk, k, B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  to_heads(fv, v, B, n, local.kv_heads, Dv, local.v_row_stride, local.value_batch_stride());
  to_heads(fo, out, B, n, local.q_heads, Dv, width, n * width);
  to_heads(fdo, d_out, B, n, local.q_heads, Dv, width, n * width);
  lse_to_heads(fl, lse, B, n, local.q_heads);
  // The gradients of this rank's head shard over the whole sequence.
  float* fdq = workspace_.slot(6, q_size);
  float* fdk = workspace_.slot(7, kv_size);
  float* fdv = workspace_.slot(8, v_size);
  ops.attention_backward(fdq, fdk, fdv, fdo, fq, fk, fv, fo, fl,
                         full_sequence_shape(local, T, hq, hkv), precision, {});
  from_heads(dq, fdq, B, n, local.q_heads, D, local.q_row_stride, local.q_batch_stride);
  from_heads(dk, fdk, B, n, local.kv_heads, D, local.k_row_stride, local.kv_batch_stride);
  from_heads(dv, fdv, B, n, local.kv_heads, Dv, local.v_row_stride, local.value_batch_stride());
}

}  // namespace lattice::parallel
