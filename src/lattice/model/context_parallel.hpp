// The seam through which context parallelism reaches the layers. Under cp > 1 each rank holds a
// share of every sequence's tokens — runs of consecutive positions (the causal load-balanced split
// gives each rank two) — and every layer but attention runs unchanged on those rows. Attention is
// the one place tokens meet: a ContextAttention computes it for this rank's queries over the keys
// of the whole sequence (parallel/context/: ring attention, Ulysses all-to-all). Positions follow
// the runs (RoPE angles, GPT-2's learned positions): the helpers below apply them run by run.
#pragma once

#include <cstdint>
#include <vector>

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
  // give the positions); out [batch, local_len, q_heads·head_dim] and lse [batch, q_heads,
  // local_len] as Ops::attention_forward writes them.
  virtual void forward(kernels::Ops& ops, float* out, float* lse, const float* q, const float* k,
                       const float* v, const kernels::AttentionShape& local,
                       kernels::Precision precision) = 0;
  // The gradients of this rank's q, k, v (same strides; overwritten) from every rank's queries.
  virtual void backward(kernels::Ops& ops, float* dq, float* dk, float* dv, const float* d_out,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const kernels::AttentionShape& local,
                        kernels::Precision precision) = 0;
  // Seconds spent waiting on this rank's context-parallel communication since the last call.
  virtual double take_wait_seconds() = 0;
};

// Ops::rope on x [batch, local_len, heads, head_dim] (row_stride, batch_stride as Ops::rope), at
// each run's positions; without context parallelism (null) positions 0 .. local_len - 1.
void rope_at_runs(kernels::Ops& ops, const ContextAttention* context,
                  const kernels::RopeTable& table, float* x, int64_t batch, int64_t local_len,
                  int64_t heads, int64_t row_stride, int64_t batch_stride, bool inverse);

}  // namespace lattice::model
