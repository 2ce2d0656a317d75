// The GELU MLP sub-layer (GPT-2): x + proj(gelu(fc(norm(x)))) with its pre-norm, fc column-split
// and proj row-split over the layout's group. In bf16 behind a LayerNorm it takes the fused paths:
// the norm writes fc's bf16 input, fc and the GELU run as one op writing proj's bf16 input and the
// GELU's bf16 slope (the fp32 pre-activation is never stored), and backward takes proj's input
// gradient through the GELU in one op (Ops::linear_backward_input_through_gelu_bf16).
#pragma once

#include <string>

#include "lattice/model/components/feed_forward.hpp"

namespace lattice::model {

// Hugging Face's names relative to the block's prefix: the norm ("ln_2"), fc ("mlp.c_fc") and
// proj ("mlp.c_proj").
struct GeluMlpDescription {
  std::string norm, fc, proj;
  NormKind norm_kind = NormKind::layer_norm;
  int64_t hidden = 0;  // the whole model's MLP width
  bool bias = true;
};

// rows = B·T, F = this rank's MLP width.
struct GeluMlpActivations final : FeedForwardActivations {
  Tensor fc;       // [rows, F] pre-activation (fp32 only; the fused bf16 path never stores it)
  Tensor gelu;     // [rows, F] GELU output (fp32; in bf16 only proj's bf16 input)
  Tensor slope16;  // [rows, F] bf16: the GELU's slope at the pre-activation
  LinearActivations fc_saved, proj_saved;
  Tensor d_fc;  // between backward_input and backward_weight: fc's d_out (fused: rounded)
  // d_out (the base's) holds proj's: fp32 [rows, C], or fused its bf16 rounding.
  void release() override;
};

class GeluMlp final : public FeedForward {
 public:
  GeluMlp(ParameterStore& store, const std::string& prefix, const GeluMlpDescription& d,
          int64_t d_model, float norm_eps, const parallel::SequenceLayout& layout,
          parallel::TensorSplit fc_split, parallel::TensorSplit proj_split);

  std::unique_ptr<FeedForwardActivations> make_activations() const override;
  void prepare(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows) const override;
  void forward(const LayerContext& ctx, FeedForwardActivations& a, float* x_out, const float* x,
               int64_t rows, Tensor& partial, float loss_scale) override;
  void backward(const LayerContext& ctx, FeedForwardActivations& a, const SublayerBackward& g,
                float* d_x, const float* d_x_out, const float* x) override;
  void weight_pass(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows,
                   float* gathered) override;

  bool regathers_fp32(kernels::Precision precision) const override { return !fused(precision); }
  bool uses_projection_gradient() const override { return false; }
  int64_t norm_partial_floats() const override;
  int64_t saved_bytes(kernels::Precision precision, int64_t rows) const override;
  int64_t scratch_floats(kernels::Precision precision, int64_t rows) const override;
  int64_t pending_weight_floats(kernels::Precision precision, int64_t rows) const override;
  int64_t transient_bytes(kernels::Precision precision, int64_t rows) const override;

 private:
  bool fused(kernels::Precision precision) const {
    return precision == kernels::Precision::bf16 && norm_.writes_bf16();
  }

  parallel::SequenceLayout layout_;
  Norm norm_;
  Linear fc_, proj_;
  int64_t C_ = 0, F_ = 0;  // the model width; this rank's MLP width
};

}  // namespace lattice::model
