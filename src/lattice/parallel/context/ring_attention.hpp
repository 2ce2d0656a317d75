// Ring attention (Liu et al., 2023) over the cp ranks with the causal load-balanced split
// (sequence_split.hpp). Each rank keeps its queries; the key/value blocks travel around the ring
// (rank r sends to r + 1 and receives from r − 1), one step per rank, and each step's partial
// attention over the block in hand is folded into the running result through the log-sum-exp
// (Ops::attention_merge_partial): exactly the softmax over all keys. The next block's transfer is
// posted before the current block's compute, so it overlaps it. The backward sends the blocks
// around again, each with the key/value gradient summed so far from the ranks it has visited; after
// the last step the finished gradient goes home to its owner (one more hop).
#pragma once

#include "lattice/comm/communicator.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/model/context_parallel.hpp"
#include "lattice/parallel/context/row_copies.hpp"

namespace lattice::parallel {

class RingAttention final : public model::ContextAttention {
 public:
  // `cp`: the context-parallel group (Mesh::group(Axis::cp)); it must outlive this object.
  // Its buffers (kept from call to call: ContextWorkspace) are counted in `tracker` (may be null)
  // as activations.
  RingAttention(comm::Communicator& cp, MemoryTracker* tracker);

  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  std::vector<model::PositionRun> runs(int64_t local_len) const override;
  void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
               const float* v, const kernels::AttentionShape& local,
               kernels::Precision precision) override;
  void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                const float* q, const float* k, const float* v, const float* out, const float* lse,
                const kernels::AttentionShape& local, kernels::Precision precision) override;
  double take_wait_seconds() override;

 private:
  // Waits for `handle`, adding the blocked time to wait_seconds_.
  void wait(comm::CommHandle& handle);

  comm::Communicator& cp_;
  ContextWorkspace workspace_;
  double wait_seconds_ = 0;
};

}  // namespace lattice::parallel
