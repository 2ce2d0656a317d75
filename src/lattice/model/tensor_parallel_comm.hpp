// The tensor-parallel group's collectives as the layers use them: the all-reduce of a row-parallel
// layer's partial output (and of a column-parallel layer's partial input gradient), and, under
// sequence parallelism (Korthikanti et al.), the all-gather of this rank's sequence rows before a
// column-parallel layer and the reduce-scatter of partial sums back onto them after a row-parallel
// one. Each adds its exposed wall time to *tp.comm_seconds when set.
//
// Sequence rows: with TensorParallelGroup::sequence_parallel, the residual stream of B sequences of
// T tokens (rows = B·T, in [B, T] order) is split into tp contiguous chunks of rows / tp; tp rank r
// holds rows [r · rows / tp, (r + 1) · rows / tp). Gathering the chunks in rank order rebuilds the
// whole [rows, width] tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "lattice/comm/comm_handle.hpp"
#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"

namespace lattice::model {

// x[0, n) summed (or reduced by `op`) over the tensor-parallel group, in place (nothing at tp = 1):
// the all-reduce after a row-parallel layer's forward, after a column-parallel layer's input
// gradient, and the vocabulary-parallel loss's.
void all_reduce_over_tp(const TensorParallelGroup& tp, float* x, int64_t n,
                        comm::ReduceOp op = comm::ReduceOp::sum);

// full [rows, width] = this rank's sequence rows `local` [rows / tp, width] gathered from every tp
// rank (fp32, or bf16 when `dtype` is bf16; `local` and `full` are separate buffers).
void gather_sequence(const TensorParallelGroup& tp, void* full, const void* local, int64_t rows,
                     int64_t width, DType dtype = DType::f32);
// local [rows / tp, width] = this rank's sequence rows of the sum over tp of `partial` [rows,
// width].
void reduce_scatter_sequence(const TensorParallelGroup& tp, float* local, const float* partial,
                             int64_t rows, int64_t width);

// The reduction after a row-parallel layer (forward) or a column-parallel one (input gradient):
// `partial` [rows, width] summed over tp into `out` — in place (out == partial) without sequence
// parallelism, onto this rank's sequence rows [rows / tp, width] with it.
void reduce_over_tp(const TensorParallelGroup& tp, float* out, float* partial, int64_t rows,
                    int64_t width);

// A row-parallel layer's forward with its reduction over tp. `gemm(first, count)` writes the
// layer's partial sums of rows [first, first + count) into `partial` ([rows, width]). Without
// sequence parallelism: one GEMM over all rows, then the all-reduce in place (out == partial).
// With it, the reduce-scatter in pieces: the GEMM on tp chunks of rows / tp in rank order, each
// chunk's partial sums reduced onto its owner rank (into `out`, [rows / tp, width], on that rank)
// while the next chunk's GEMM runs (TensorParallelGroup::overlap; without it each reduce blocks:
// the same arithmetic).
void row_parallel_forward(const TensorParallelGroup& tp,
                          const std::function<void(int64_t first, int64_t count)>& gemm, float* out,
                          float* partial, int64_t rows, int64_t width);

class TpCollective;
// The column-parallel layers' forward over all rows while `gather`, the all-gather of their input
// under sequence parallelism, is in flight: `gemm(first, count, own)` first on this rank's own rows
// (own = true: the caller reads them from its local rows), then, once the gather is done, on the
// rows before and after them (own = false: from the gathered buffer). Without sequence
// parallelism: gemm(0, rows, false). TensorParallelGroup::overlap off waits first (the same
// pieces, the same bits).
void column_parallel_forward(
    const TensorParallelGroup& tp, TpCollective& gather,
    const std::function<void(int64_t first, int64_t count, bool own)>& gemm, int64_t rows);

// An asynchronous collective of the group, started at construction and finished by wait() or the
// destructor: what runs in between (a layer's weight-gradient GEMMs, or its input-gradient GEMM)
// overlaps it. Adds the time wait() blocks, the exposed part, to *tp.comm_seconds when set.
class TpCollective {
 public:
  // The sum over tp of x[0, n), in place.
  static TpCollective all_reduce(const TensorParallelGroup& tp, float* x, int64_t n);
  // reduce_over_tp's reduction (all-reduce in place, or reduce-scatter onto the sequence rows).
  static TpCollective reduce(const TensorParallelGroup& tp, float* out, float* partial,
                             int64_t rows, int64_t width);
  // Nothing to wait for (a collective that did not need to run).
  static TpCollective none(const TensorParallelGroup& tp) { return TpCollective(tp); }
  // The sum over tp of in[0, n) into out on tp rank `root` (out unused elsewhere).
  static TpCollective reduce_to(const TensorParallelGroup& tp, float* out, const float* in,
                                int64_t n, int root);
  // gather_sequence's all-gather.
  static TpCollective gather(const TensorParallelGroup& tp, void* full, const void* local,
                             int64_t rows, int64_t width, DType dtype = DType::f32);
  ~TpCollective();
  TpCollective(TpCollective&& other) noexcept;
  TpCollective(const TpCollective&) = delete;
  TpCollective& operator=(const TpCollective&) = delete;
  TpCollective& operator=(TpCollective&& other) noexcept;  // finishes this one first
  void wait();

 private:
  explicit TpCollective(const TensorParallelGroup& tp) : tp_(&tp) {}
  const TensorParallelGroup* tp_;
  comm::CommHandle handle_;
  bool pending_ = false;
};

// Sequence parallelism: the gradient of a replicated parameter (a norm's weight and bias) from this
// rank's sequence rows is a partial sum. The backward writes it into zeroed scratch (targets()),
// finish() sums it over tp and adds it to the parameter gradients. Without sequence parallelism the
// targets are the gradients themselves and finish() does nothing.
class ReplicatedGradients {
 public:
  // `grads`: the parameters' gradient buffers (null entries skipped), `n` floats each.
  ReplicatedGradients(const TensorParallelGroup& tp, kernels::Ops& ops,
                      std::initializer_list<float*> grads, int64_t n, float* scratch);
  float* target(size_t i) const { return targets_[i]; }
  void finish();

 private:
  const TensorParallelGroup& tp_;
  kernels::Ops& ops_;
  std::vector<float*> grads_, targets_;
  int64_t n_;
  float* scratch_;
};

}  // namespace lattice::model
