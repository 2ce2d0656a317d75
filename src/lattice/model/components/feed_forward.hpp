// The MLP sub-layer of a transformer block, x_out = x + mlp(norm(x)), with its pre-norm: the
// interface its kinds implement — GeluMlp (GPT-2), SwiGluMlp (Llama) and MoeLayer (routed experts,
// with shared experts beside them) — over caller-owned activations, written for one rank and run
// on the SequenceLayout the block is built with.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/model/components/normed_input.hpp"
#include "lattice/model/moe_statistics.hpp"

namespace lattice::model {

// What an MLP's forward saves: its norm's, the output projection's d_out kept for a deferred
// weight half, and its kind's own (the derived struct).
struct FeedForwardActivations {
  virtual ~FeedForwardActivations() = default;
  virtual void release();
  NormActivations norm;
  Tensor d_out;
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  virtual std::unique_ptr<FeedForwardActivations> make_activations() const = 0;
  // Sizes the saved tensors for B·T rows.
  virtual void prepare(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows) const = 0;
  // x_out = x + mlp(norm(x)) on the layout's own rows of `rows` rows. `partial`: the output
  // projection's partial sums over all rows on a sharded layout (the attention sub-layer's buffer,
  // reused). `loss_scale`: the micro-batch's weight in the step's loss (MoE balancing losses).
  virtual void forward(const LayerContext& ctx, FeedForwardActivations& a, float* x_out,
                       const float* x, int64_t rows, Tensor& partial, float loss_scale) = 0;
  // d_x (overwritten; this rank's rows) from d_x_out, which it adds as the residual's gradient.
  virtual void backward(const LayerContext& ctx, FeedForwardActivations& a,
                        const SublayerBackward& g, float* d_x, const float* d_x_out,
                        const float* x) = 0;
  // The deferred weight halves; `gathered` ([rows, C] fp32, sharded layouts) for the norm output
  // gathered again.
  virtual void weight_pass(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows,
                           float* gathered) = 0;

  // Whether the fused bf16 paths run (no fp32 regather then), and the activation-memory terms
  // (see Block; scratch: its own slots, the shared ones are the block's).
  virtual bool regathers_fp32(kernels::Precision precision) const = 0;
  virtual bool uses_projection_gradient() const = 0;
  virtual int64_t norm_partial_floats() const = 0;
  virtual int64_t saved_bytes(kernels::Precision precision, int64_t rows) const = 0;
  virtual int64_t scratch_floats(kernels::Precision precision, int64_t rows) const = 0;
  virtual int64_t pending_weight_floats(kernels::Precision precision, int64_t rows) const = 0;
  // The most its forward or backward allocates and frees again, beside the partial sums.
  virtual int64_t transient_bytes(kernels::Precision precision, int64_t rows) const = 0;

  // A MoE layer's routing (moe_statistics.hpp) and its auxiliary-loss-free bias update (see
  // Block); none for a dense MLP.
  virtual std::optional<MoeLayerStatistics> moe_statistics(const FeedForwardActivations& a) const {
    (void)a;
    return std::nullopt;
  }
  virtual bool update_choice_bias(const std::vector<int64_t>& load, double rate) {
    (void)load, (void)rate;
    return false;
  }
};

// The activations struct of an MLP kind behind a FeedForwardActivations reference (checked).
template <typename Saved>
Saved& mlp_saved_as(FeedForwardActivations& a) {
  auto* typed = dynamic_cast<Saved*>(&a);
  check(typed != nullptr, "an MLP was handed another MLP kind's activations (internal error)");
  return *typed;
}

// The MLP's output gradient over all rows, d_out [rows, C], from d_x_out (this rank's rows):
// gathered on a sharded layout; on a whole layout d_x_out itself — unless `keep_fp32` (the output
// projection's deferred weight half reads the fp32 d_out, and d_x_out may be overwritten by the
// block's d_x_in), then a copy kept in `pending`.
const float* mlp_output_gradient(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                                 const SublayerBackward& g, Tensor& pending, const float* d_x_out,
                                 int64_t width, bool keep_fp32);

}  // namespace lattice::model
