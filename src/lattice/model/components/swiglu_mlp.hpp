// The SwiGLU MLP (Llama): down(silu(gate(n)) · up(n)) over a norm's output n, gate and up
// column-split, down row-split over the layout's group. SwiGluProjections is the three projections
// on their own (a MoE layer's shared experts use them beside the routed experts); SwiGluMlp is the
// whole sub-layer, x + swiglu(norm(x)), with its pre-norm. In bf16 the sub-layer's norm writes gate
// and up's one shared bf16 input (gate's prepared input), where each would round the fp32 norm
// output into a copy of its own.
#pragma once

#include <functional>
#include <string>

#include "lattice/model/components/feed_forward.hpp"

namespace lattice::model {

// Hugging Face's names relative to the block's prefix ("mlp.gate_proj", ...).
struct SwiGluDescription {
  std::string gate, up, down;
  int64_t hidden = 0;  // the whole model's width
};

// A whole SwiGLU sub-layer: its pre-norm ("post_attention_layernorm") and the projections.
struct SwiGluMlpDescription {
  std::string norm;
  NormKind norm_kind = NormKind::rms_norm;
  SwiGluDescription projections;
};

// rows = B·T, F = this rank's width.
struct SwiGluActivations {
  Tensor gate, up, h;  // [rows, F] each: SwiGLU's inputs and output
  LinearActivations gate_saved, up_saved, down_saved;
  bool shared_input = false;  // gate and up read gate_saved's prepared bf16 input (forward)
  Tensor d_gate, d_up;        // between backward_input and backward_weight: gate's and up's d_out
  void release();
};

class SwiGluProjections {
 public:
  SwiGluProjections() = default;
  SwiGluProjections(ParameterStore& store, const std::string& prefix, const SwiGluDescription& d,
                    int64_t d_model, const parallel::SequenceLayout& layout,
                    parallel::TensorSplit input_split, parallel::TensorSplit output_split);

  int64_t width() const { return F_; }
  void prepare(const LayerContext& ctx, SwiGluActivations& a, int64_t rows) const;
  // x_out (this rank's rows) = the reduction of down's partial sums (through `partial` on a
  // sharded layout) from the normed rows `in` (`gathered`: their buffer, freed once gate and up
  // have read it); no residual. Normed rows without fp32 (in.all null: normalize into
  // shared_input_owner()) are gate and up's shared bf16 input.
  Linear* shared_input_owner() { return &gate_; }
  void forward(const LayerContext& ctx, SwiGluActivations& a, NormedRows& in, Tensor& gathered,
               float* x_out, int64_t rows, Tensor& partial);
  // From d_y (all rows): down's backward, the SwiGLU's, and gate's and up's input halves summed
  // into g.d_rows; `in` is their fp32 input over all rows (null when deferred, or when they share
  // gate's bf16 input, which must then be all rows' again for the weight halves). Returns their
  // weight halves, for finish_input_projections.
  std::function<void()> backward(const LayerContext& ctx, SwiGluActivations& a,
                                 const SublayerBackward& g, const float* d_y, const float* in);
  // The deferred weight halves from the kept output gradients (d_y: down's d_out).
  void weight_pass(const LayerContext& ctx, SwiGluActivations& a, const float* d_y, const float* in,
                   int64_t rows);

  int64_t saved_bytes(kernels::Precision precision, int64_t rows, bool shared_input = false) const;
  int64_t scratch_floats(int64_t rows) const { return 3 * rows * F_; }  // d_h, d_gate, d_up
  int64_t pending_weight_floats(int64_t rows) const { return rows * (2 * F_ + C_); }
  int64_t entry_transient_bytes(kernels::Precision precision, int64_t rows,
                                bool shared_input = false) const;

 private:
  parallel::SequenceLayout layout_;
  Linear gate_, up_, down_;
  // gate's prepared input, shared with up (checked).
  const lattice::bf16* shared_input(const SwiGluActivations& a) const;
  // gate's and up's forward on the fp32 normed rows (each rounding them in bf16).
  void forward_fp32_input(const LayerContext& ctx, SwiGluActivations& a, NormedRows& in,
                          int64_t rows);
  int64_t C_ = 0, F_ = 0;
};

struct SwiGluMlpActivations final : FeedForwardActivations {
  SwiGluActivations swiglu;
  void release() override;
};

class SwiGluMlp final : public FeedForward {
 public:
  SwiGluMlp(ParameterStore& store, const std::string& prefix, const SwiGluMlpDescription& d,
            int64_t d_model, float norm_eps, const parallel::SequenceLayout& layout,
            parallel::TensorSplit input_split, parallel::TensorSplit output_split);

  std::unique_ptr<FeedForwardActivations> make_activations() const override;
  void prepare(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows) const override;
  void forward(const LayerContext& ctx, FeedForwardActivations& a, float* x_out, const float* x,
               int64_t rows, Tensor& partial, float loss_scale) override;
  void backward(const LayerContext& ctx, FeedForwardActivations& a, const SublayerBackward& g,
                float* d_x, const float* d_x_out, const float* x) override;
  void weight_pass(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows,
                   float* gathered) override;

  // bf16: gate and up share one bf16 input the norm writes (no fp32 norm output).
  bool shares_input(kernels::Precision precision) const {
    return precision == kernels::Precision::bf16;
  }
  bool regathers_fp32(kernels::Precision precision) const override {
    return !shares_input(precision);
  }
  bool uses_projection_gradient() const override { return true; }
  int64_t norm_partial_floats() const override;
  int64_t saved_bytes(kernels::Precision precision, int64_t rows) const override;
  int64_t scratch_floats(kernels::Precision, int64_t rows) const override {
    return swiglu_.scratch_floats(rows);
  }
  int64_t pending_weight_floats(kernels::Precision, int64_t rows) const override {
    return swiglu_.pending_weight_floats(rows);
  }
  int64_t transient_bytes(kernels::Precision precision, int64_t rows) const override {
    return swiglu_.entry_transient_bytes(precision, rows, shares_input(precision));
  }

 private:
  parallel::SequenceLayout layout_;
  Norm norm_;
  SwiGluProjections swiglu_;
  int64_t C_ = 0;
};

}  // namespace lattice::model
