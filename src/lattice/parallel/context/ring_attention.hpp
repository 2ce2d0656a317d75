// Ring attention (Liu et al., 2023) over the cp ranks with the causal load-balanced split
// (sequence_split.hpp). Each rank keeps its queries; the key/value blocks travel around the ring
// (rank r sends to r + 1 and receives from r − 1), one step per rank, and each step's partial
// attention over the block in hand is folded into the running result through the log-sum-exp
// (Ops::attention_merge_partial): exactly the softmax over all keys. The next block's transfer is
// posted before the current block's compute, so it overlaps it. The backward sends the blocks
// around again, each with the key/value gradient summed so far from the ranks it has visited; after
// the last step the finished gradient goes home to its owner (one more hop).
#pragma once

#include <array>
#include <cstdint>

#include "lattice/parallel/context/context_group_attention.hpp"

namespace lattice::parallel {

class RingAttention final : public ContextGroupAttention {
 public:
  // `cp`: the context-parallel group (Mesh::group(Axis::cp)); it must outlive this object.
  // Its buffers (kept from call to call: ContextWorkspace) live in `memory` (the backend's) and
  // are counted in `tracker` (may be null) as activations.
  RingAttention(comm::Communicator& cp, DeviceMemory& memory, MemoryTracker* tracker)
      : ContextGroupAttention(cp, memory, tracker) {}

  void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
               const float* v, const kernels::AttentionShape& local,
               kernels::Precision precision) override;
  void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                const float* q, const float* k, const float* v, const float* out, const float* lse,
                const kernels::AttentionShape& local, kernels::Precision precision) override;

 private:
  // Waits for `handle`, counted as time waited on the group.
  void wait(comm::CommHandle& handle) {
    waited([&] { handle.wait(); });
  }
  // The key/value blocks that travel: this rank's own [k | v] ([B, n, kv_heads·head_dim] then
  // [B, n, kv_heads·value_dim()]: values of their own width travel at it) packed into workspace
  // slot 0, and slot 1 for the one arriving — fp32, or rounded to bf16 under
  // Precision::bf16 (the kernel rounds k and v to bf16 before its products anyway: the same
  // result for half the bytes).
  struct Blocks {
    std::array<void*, 2> data;
    int64_t count;  // elements of one block
    DType dtype;
  };
  Blocks own_blocks(kernels::Ops& ops, const float* k, const float* v,
                    const kernels::AttentionShape& local, kernels::Precision precision);
  // The block in hand as fp32 for the kernels: itself, or widened into workspace slot 14.
  const float* held_fp32(kernels::Ops& ops, const Blocks& blocks, int index);
};

}  // namespace lattice::parallel
