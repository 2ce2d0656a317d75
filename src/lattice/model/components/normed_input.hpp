// The start and the end of a pre-norm residual sub-layer, x_out = x +
// out_proj(f(in_projs(norm(x)))), as its components share them (Megatron-core's
// LayerNormColumnParallelLinear and RowParallelLinear, written once over the SequenceLayout):
//   - the norm runs on the layout's own rows of the residual stream; the input projections read its
//     output over all rows: the output itself on a whole layout, gathered from every rank on a
//     sharded one (in flight while the projections start on this rank's own rows). In the fused
//     bf16 paths the norm writes bf16 straight into the first projection's prepared input.
//   - backward sums the input projections' input gradients over all rows and reduces them onto the
//     layout's rows while their weight halves run, then runs the norm's backward with the residual
//     gradient added.
//   - the output projection's partial sums are reduced onto the layout's rows (forward_reduced)
//     and the residual added.
#pragma once

#include <cstdint>
#include <functional>

#include "lattice/core/tensor.hpp"
#include "lattice/model/block.hpp"
#include "lattice/model/components/norm.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

// Where the input projections find the norm's output once normalize() returns.
struct NormedRows {
  // fp32: this rank's own rows (the norm output, [local, C]) and all rows ([rows, C]: `own` itself
  // on a whole layout, the gathered buffer on a sharded one). Null in the fused bf16 path.
  const float* own = nullptr;
  const float* all = nullptr;
  // Fused bf16: this rank's own rows of the bf16 output on a sharded layout (the prepared input
  // gathers them), null on a whole one (the norm wrote the prepared input itself).
  const lattice::bf16* own16 = nullptr;
  // The gather of the other ranks' rows, still in flight (nothing on a whole layout).
  parallel::GroupCollective gather;
};

// The norm's forward for the input projections: fp32 into a.out (gathered into `gathered`, [rows,
// C], allocated here, on a sharded layout), or, when `fused` is given, in bf16 into that
// projection's prepared input (through a.out16 on a sharded layout).
NormedRows normalize(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                     const Norm& norm, NormActivations& a, const float* x, int64_t rows,
                     Tensor& gathered, Linear* fused = nullptr,
                     LinearActivations* fused_saved = nullptr);

// Sequence-sharded layouts: the input projections' input over all rows again for their weight
// gradients, gathered (asynchronously: wait for the returned collective, which waits at once when
// the layout does not overlap) from the saved norm output — fp32 into `gathered` [rows, C]
// (*input set to it), fused bf16 into `fused`'s prepared input (*input null). On a whole layout
// nothing moves: *input is the saved fp32 output (null in the fused path).
parallel::GroupCollective regather(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                                   const NormActivations& a, float* gathered, int64_t rows,
                                   const float** input, Linear* fused = nullptr,
                                   LinearActivations* fused_saved = nullptr);

// The output projection's forward (row-split: its output is a partial sum over the group):
// `gemm(out, first, count)` writes rows [first, first + count) of the [rows, width] partial sums
// into `out`; they are reduced onto x_out — all-reduced in place on a whole layout, reduce-
// scattered onto this rank's rows from `partial` (grown here) on a sharded one, each chunk's
// reduction overlapping the next chunk's GEMM. The residual is the caller's.
void output_projection_forward(
    const LayerContext& ctx, const parallel::SequenceLayout& layout, float* x_out, int64_t rows,
    int64_t width, Tensor& partial,
    const std::function<void(float* out, int64_t first, int64_t count)>& gemm);

// What one sub-layer's backward works with, set up by the block: the rows, whether the weight
// halves are deferred (backward_input) and whether the input projections run their halves apart
// (deferred, or a group of several ranks, whose reduction then overlaps the weight halves), and
// the shared buffers.
struct SublayerBackward {
  int64_t B = 0, T = 0, rows = 0, local = 0;
  bool defer = false, split = false;
  float* d_norm = nullptr;         // [local, C] ∂loss/∂ the norm's output
  float* d_rows = nullptr;         // [rows, C] the summed input gradient before its reduction
                                   // (d_norm itself on a whole layout)
  float* regathered = nullptr;     // [rows, C] fp32 sharded: the norm output gathered again
  float* norm_partials = nullptr;  // [2C] sharded: the norm weights' partial gradients
  BackwardScratch* scratch = nullptr;
  DeviceMemory* memory = nullptr;  // the backend's: scratch and kept gradients live there
  MemoryTracker* tracker = nullptr;

  // A scratch buffer of `numel` floats in slot `slot`.
  float* get(int slot, int64_t numel) const { return scratch->get(slot, numel, *memory, tracker); }
  // The output gradient a Linear's weight half reads: scratch slot `slot` when it runs in this
  // backward, `pending` (kept until backward_weight) when deferred.
  float* kept(Tensor& pending, int slot, int64_t numel) const {
    return weight_gradient_operand(defer, pending, *scratch, slot, numel, *memory, tracker);
  }
};

// The input projections' summed input gradient (in g.d_rows) reduced onto g.d_norm (nothing to
// reduce when the halves are not split), with `weight_halves` run meanwhile once `input_gather`
// (the regathered input) is done — unless deferred.
void finish_input_projections(const parallel::SequenceLayout& layout, const SublayerBackward& g,
                              int64_t width, parallel::GroupCollective& input_gather,
                              const std::function<void()>& weight_halves);

// One input projection's backward into d_in: its input half, or, when the halves are not split,
// both (reading `in`, its fp32 input over all rows).
void input_projection_backward(const LayerContext& ctx, const SublayerBackward& g, Linear& layer,
                               const LinearActivations& saved, float* d_in, const float* d_out,
                               const float* in);
// The output projection's backward into d_in: its input half when deferred, else both.
void output_projection_backward(const LayerContext& ctx, const SublayerBackward& g, Linear& layer,
                                const LinearActivations& saved, float* d_in, const float* d_out,
                                const float* in);

}  // namespace lattice::model
