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

#include "lattice/parallel/context/context_group_attention.hpp"

namespace lattice::parallel {

class RingAttention final : public ContextGroupAttention {
 public:
  // `cp`: the context-parallel group (Mesh::group(Axis::cp)); it must outlive this object.
  // Its buffers (kept from call to call: ContextWorkspace) are counted in `tracker` (may be null)
  // as activations.
  RingAttention(comm::Communicator& cp, MemoryTracker* tracker)
      : ContextGroupAttention(cp, tracker) {}

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
  // This rank's own [k | v] block into workspace slot 0 ([B, n, width] each); returns slots 0, 1.
  std::array<float*, 2> own_block(const float* k, const float* v,
                                  const kernels::AttentionShape& local);
};

}  // namespace lattice::parallel
