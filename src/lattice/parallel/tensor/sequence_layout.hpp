// SequenceLayout: where the residual stream's rows live over a tensor-parallel group, and the
// collectives that move a block's activations between that layout and the all-rows layout its
// split projections compute on. Whole (every rank holds all B·T rows; one rank, or tensor
// parallelism without sequence parallelism) or sharded by sequence rows (Korthikanti et al.): the
// rows = B·T of B sequences of T tokens, in [B, T] order, split into `ranks()` contiguous chunks,
// rank r holding rows [r · rows / ranks, (r + 1) · rows / ranks); gathering them in rank order
// rebuilds the whole [rows, width] tensor.
//
// The model's components are written for one rank and call only this object: its reductions,
// gathers and piecewise forwards are no-ops or single calls on a group of one, and the same code
// runs split when the Transformer is built on a larger group. Each collective adds the wall time
// it blocks to the group's comm_seconds when set.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "lattice/comm/comm_handle.hpp"
#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/parallel/tensor/linear_split.hpp"
#include "lattice/parallel/tensor/tensor_parallel_group.hpp"

namespace lattice::parallel {

// An asynchronous collective of the layout's group, started by a SequenceLayout::start_* call and
// finished by wait() or the destructor: what runs in between (a layer's weight-gradient GEMMs, or
// its input-gradient GEMM) overlaps it. Adds the time wait() blocks, the exposed part, to the
// group's comm_seconds when set.
class GroupCollective {
 public:
  GroupCollective() = default;  // nothing to wait for
  ~GroupCollective();
  GroupCollective(GroupCollective&& other) noexcept;
  GroupCollective(const GroupCollective&) = delete;
  GroupCollective& operator=(const GroupCollective&) = delete;
  GroupCollective& operator=(GroupCollective&& other) noexcept;  // finishes this one first
  void wait();

 private:
  friend class SequenceLayout;
  GroupCollective(comm::CommHandle handle, double* comm_seconds);
  comm::CommHandle handle_;
  double* comm_seconds_ = nullptr;
  bool pending_ = false;
};

class SequenceLayout {
 public:
  SequenceLayout() = default;  // one rank
  explicit SequenceLayout(const TensorParallelGroup& group) : group_(group) {}

  // The ranks the block's projections are split over and this rank's index among them.
  int ranks() const { return group_.size; }
  int rank() const { return group_.rank; }
  // Whether the residual rows are split over the ranks (else every rank holds all of them).
  bool sharded() const { return group_.sequence_parallel; }
  // Whether collectives overlap the GEMMs beside them (false: each blocks; the same bits).
  bool overlaps() const { return group_.overlap; }
  // The rows of `rows` this rank holds, and where they start in the all-rows layout.
  int64_t local_rows(int64_t rows) const { return group_.local_rows(rows); }
  int64_t first_own_row(int64_t rows) const { return sharded() ? rank() * local_rows(rows) : 0; }
  // A projection's slice of its weight under `kind` (LinearSplit).
  LinearSplit split(TensorSplit kind, int blocks = 1) const;
  const TensorParallelGroup& group() const { return group_; }

  // x[0, n) reduced by `op` over the group, in place (nothing on one rank).
  void all_reduce(float* x, int64_t n, comm::ReduceOp op = comm::ReduceOp::sum) const;
  // all [rows, width] = every rank's own rows `own` [rows / ranks, width] gathered (fp32, or bf16
  // when `dtype` is bf16; separate buffers). Sharded layouts only.
  void gather(void* all, const void* own, int64_t rows, int64_t width,
              DType dtype = DType::f32) const;
  // `partial` [rows, width] summed over the group onto the layout's rows of `out`: in place
  // (out == partial) when whole, onto this rank's own rows [rows / ranks, width] when sharded.
  void reduce(float* out, float* partial, int64_t rows, int64_t width) const;
  // own [rows / ranks, width] = this rank's rows of the sum over the group of `partial`.
  void reduce_scatter(float* own, const float* partial, int64_t rows, int64_t width) const;

  // The same, started asynchronously.
  GroupCollective start_all_reduce(float* x, int64_t n) const;
  GroupCollective start_gather(void* all, const void* own, int64_t rows, int64_t width,
                               DType dtype = DType::f32) const;
  GroupCollective start_reduce(float* out, float* partial, int64_t rows, int64_t width) const;
  // The sum over the group of in[0, n) into out on rank `root` (out unused elsewhere).
  GroupCollective start_reduce_to(float* out, const float* in, int64_t n, int root) const;

  // The forward of the projections that read a gathered input (column-split), while `gather`
  // brings the other ranks' rows: `gemm(first, count, own)` first on this rank's own rows (own =
  // true: the caller reads them from its local rows), then, once the gather is done, on the rows
  // before and after them (own = false: from the gathered buffer). Whole layouts: gemm(0, rows,
  // false). Without overlap the gather is waited for first (the same pieces, the same bits).
  void forward_gathered(GroupCollective& gather,
                        const std::function<void(int64_t first, int64_t count, bool own)>& gemm,
                        int64_t rows) const;
  // The forward of a projection whose output is a partial sum over the group (row-split) with its
  // reduction onto the layout's rows: `gemm(first, count)` writes rows [first, first + count) of
  // `partial` [rows, width]. Whole layouts: one GEMM, then the all-reduce in place (out ==
  // partial). Sharded: the GEMM on ranks() chunks in rank order, each chunk reduced onto its owner
  // (into `out`, [rows / ranks, width], there) while the next chunk's GEMM runs.
  void forward_reduced(const std::function<void(int64_t first, int64_t count)>& gemm, float* out,
                       float* partial, int64_t rows, int64_t width) const;

 private:
  void check_sharded_rows(int64_t rows) const;
  TensorParallelGroup group_;
};

// The gradient of a parameter every rank holds whole (a norm's weight and bias) from this rank's
// sequence rows is a partial sum. The backward writes it into zeroed scratch (target()), finish()
// sums it over the group and adds it to the parameter gradients. On a whole layout the targets are
// the gradients themselves and finish() does nothing — unless the parameter scales split heads
// (Qwen 3's per-head q/k norm: whole on every rank, each rank's heads its own), whose gradient is
// a partial sum over the group on every layout.
class ReplicatedGradients {
 public:
  // `grads`: the parameters' gradient buffers (null entries skipped), `n` floats each; `scratch`
  // holds grads.size() · n floats (used where the gradient is partial). `over_split_heads`: the
  // rows are this rank's heads, a partial sum whenever the group has more than one rank.
  ReplicatedGradients(const SequenceLayout& layout, kernels::Ops& ops,
                      std::initializer_list<float*> grads, int64_t n, float* scratch,
                      bool over_split_heads = false);
  float* target(size_t i) const { return targets_[i]; }
  void finish();

 private:
  const SequenceLayout& layout_;
  kernels::Ops& ops_;
  std::vector<float*> grads_, targets_;
  int64_t n_;
  float* scratch_;
  bool partial_ = false;
};

}  // namespace lattice::parallel
