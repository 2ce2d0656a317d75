// LocalAttention: the ContextAttention of a rank that holds every token of its sequences (no
// context parallelism) — the attention kernels themselves on rows at positions 0 .. T - 1, one
// more implementation of the interface beside ring attention and Ulysses (parallel/context/).
#pragma once

#include "lattice/model/context_parallel.hpp"

namespace lattice::model {

class LocalAttention final : public ContextAttention {
 public:
  int size() const override { return 1; }
  int rank() const override { return 0; }
  std::vector<PositionRun> runs(int64_t local_len) const override { return {{0, 0, local_len}}; }
  void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
               const float* v, const kernels::AttentionShape& local,
               kernels::Precision precision) override;
  void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                const float* q, const float* k, const float* v, const float* out, const float* lse,
                const kernels::AttentionShape& local, kernels::Precision precision) override;
  // The bf16 kernels on the packed bf16 q, k, v (no fp32 copy; the bias gradient from the
  // attention backward's own pass).
  void forward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker, float* out, float* lse,
                           const lattice::bf16* qkv16, int64_t width, int64_t k_column,
                           int64_t v_column, const kernels::AttentionShape& local) override;
  void backward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker, lattice::bf16* d_qkv16,
                            float* column_sums, const float* d_out, const lattice::bf16* qkv16,
                            int64_t width, int64_t k_column, int64_t v_column, const float* out,
                            const float* lse, const kernels::AttentionShape& local) override;
  double take_wait_seconds() override { return 0; }
};

}  // namespace lattice::model
