// The seam through which context parallelism reaches the layers. A ContextAttention computes
// causal attention for this rank's queries over the keys of the whole sequence: on one rank every
// token is here (LocalAttention, local_attention.hpp: the kernel itself); under context
// parallelism each rank holds a share of every sequence's tokens — runs of consecutive positions
// (the causal load-balanced split gives each rank two) — and every layer but attention runs
// unchanged on those rows (parallel/context/: ring attention, Ulysses all-to-all). The attention
// component calls whichever it is handed and never asks which. Positions follow the runs (RoPE
// angles, GPT-2's learned positions): the helpers below apply them run by run.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/kernels/attention_shape.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/kernels/precision.hpp"
#include "lattice/kernels/rope_table.hpp"

namespace lattice::model {

// Rows [row, row + length) of each sequence's local rows hold positions [position, position +
// length) of the whole sequence.
struct PositionRun {
  int64_t row = 0, position = 0, length = 0;
};

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // The ranks the sequence is split over (> 1) and this rank's index among them.
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // This rank's runs when it holds `local_len` rows of each sequence (in row order).
  virtual std::vector<PositionRun> runs(int64_t local_len) const = 0;
  // Causal attention of this rank's queries over every rank's keys. `local` describes this rank's
  // q, k, v ([batch, local_len] tokens with its strides; offsets and mask are ignored: the runs
  // give the positions; values may have their own width, local.value_dim()); out [batch,
  // local_len, q_heads·value_dim()] and lse [batch, q_heads, local_len] as Ops::attention_forward
  // writes them.
  virtual void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
                       const float* v, const kernels::AttentionShape& local,
                       kernels::Precision precision) = 0;
  // The gradients of this rank's q, k, v (same strides; overwritten) from every rank's queries.
  virtual void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const kernels::AttentionShape& local,
                        kernels::Precision precision) = 0;
  // bf16 training with q, k, v packed per token in one bf16 buffer qkv16 [rows, width] (q at
  // column 0, k at k_column, v at v_column; `local`'s strides): out and lse as forward writes them.
  // The default runs forward on an exact fp32 copy (the kernels read the same rounded values).
  virtual void forward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker, float* out,
                                   float* lse, const lattice::bf16* qkv16, int64_t width,
                                   int64_t k_column, int64_t v_column,
                                   const kernels::AttentionShape& local);
  // Its backward: the gradients of q, k, v rounded to bf16 into d_qkv16 (same layout) and their
  // column sums added to column_sums [width] (the packed projection's bias gradient; may be null).
  // The default sums fp32 gradients over the ranks' queries, then rounds them once with the
  // column sums (Ops::round_with_column_sums), as the one-rank kernel does in one pass.
  virtual void backward_packed_bf16(kernels::Ops& ops, MemoryTracker* tracker,
                                    lattice::bf16* d_qkv16, float* column_sums, const float* d_out,
                                    const lattice::bf16* qkv16, int64_t width, int64_t k_column,
                                    int64_t v_column, const float* out, const float* lse,
                                    const kernels::AttentionShape& local);
  // Seconds spent waiting on this rank's context-parallel communication since the last call.
  virtual double take_wait_seconds() = 0;
};

// Ops::rope on x [batch, local_len, heads, head_dim] (row_stride, batch_stride as Ops::rope), at
// each run's positions; with a null context positions 0 .. local_len - 1.
void rope_at_runs(kernels::Ops& ops, const ContextAttention* context,
                  const kernels::RopeTable& table, float* x, int64_t batch, int64_t local_len,
                  int64_t heads, int64_t row_stride, int64_t batch_stride, bool inverse);

}  // namespace lattice::model
