// Ulysses context parallelism (Jacobs et al., DeepSpeed-Ulysses, 2023): around attention one
// all-to-all over the cp ranks trades each rank's sequence share of every head for the whole
// sequence of heads / cp of them; attention then runs locally and unsplit (causal over all
// positions), and a second all-to-all trades the outputs back. The backward moves q, k, v, the
// output, its gradient and the log-sum-exp to head shards the same way and the gradients back.
// Needs the query and key/value heads (on this tensor-parallel rank) divisible by cp.
#pragma once

#include "lattice/parallel/context/context_group_attention.hpp"

namespace lattice::parallel {

class UlyssesAttention final : public ContextGroupAttention {
 public:
  // As RingAttention's.
  UlyssesAttention(comm::Communicator& cp, DeviceMemory& memory, MemoryTracker* tracker)
      : ContextGroupAttention(cp, memory, tracker) {}

  void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
               const float* v, const kernels::AttentionShape& local,
               kernels::Precision precision) override;
  void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                const float* q, const float* k, const float* v, const float* out, const float* lse,
                const kernels::AttentionShape& local, kernels::Precision precision) override;

 private:
  // x [B, n, heads·D] (strided) on every rank -> full [B, T, heads/cp·D]: this rank's head shard
  // over the whole sequence, in position order.
  void to_heads(float* full, const float* x, int64_t B, int64_t n, int64_t heads, int64_t D,
                int64_t row_stride, int64_t batch_stride);
  // The inverse: this rank's head shard of full back into x's columns on every rank.
  void from_heads(float* x, const float* full, int64_t B, int64_t n, int64_t heads, int64_t D,
                  int64_t row_stride, int64_t batch_stride);
  // The same for per-head statistics: lse [B, heads, n] <-> full [B, heads/cp, T].
  void lse_to_heads(float* full, const float* lse, int64_t B, int64_t n, int64_t heads);
  void lse_from_heads(float* lse, const float* full, int64_t B, int64_t n, int64_t heads);
  void exchange(const float* send, float* receive, int64_t block);
  void check_heads(const kernels::AttentionShape& local) const;
};

}  // namespace lattice::parallel
