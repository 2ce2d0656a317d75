// The mixture-of-experts MLP sub-layer (Mixtral, DeepSeek, Qwen-MoE): x + routed(n) [+ shared(n)]
// over n = norm(x), the routed experts a MoeMlp (moe_mlp.hpp: router, dispatch, grouped expert
// GEMMs; split over the expert-parallel group), the always-on shared experts one SwiGLU of their
// width beside them, split like a dense MLP. The routed experts are whole on every rank of the
// layout's group: each runs them on all rows (the norm output gathered on a sharded layout) and
// keeps its own rows' output. Its balancing losses span the context's balancing group.
#pragma once

#include <string>

#include "lattice/model/components/feed_forward.hpp"
#include "lattice/model/components/swiglu_mlp.hpp"
#include "lattice/model/moe_mlp.hpp"

namespace lattice::model {

struct MoeLayerDescription {
  std::string norm;  // the pre-norm ("post_attention_layernorm")
  NormKind norm_kind = NormKind::rms_norm;
  std::string experts;  // the MoeMlp's prefix ("block_sparse_moe.", "mlp.")
  MoeSettings settings;
  MoeBalancing balancing;
  MoeNames names = MoeNames::mixtral;
  int64_t expert_hidden = 0;  // each routed expert's width
  SwiGluDescription shared;   // the shared experts (hidden 0: none), names relative to the block
};

struct MoeLayerActivations final : FeedForwardActivations {
  SwiGluActivations shared;  // the shared experts'
  MoeMlpActivations moe;     // the routing and the routed experts'
  MoeLossTerms losses;       // the balancing losses and their router gradients
  void release() override;
};

class MoeLayer final : public FeedForward {
 public:
  MoeLayer(ParameterStore& store, const std::string& prefix, const MoeLayerDescription& d,
           int64_t d_model, float norm_eps, int64_t layer_index,
           const parallel::SequenceLayout& layout, parallel::TensorSplit input_split,
           parallel::TensorSplit output_split, const ExpertParallelGroup& ep);

  std::unique_ptr<FeedForwardActivations> make_activations() const override;
  void prepare(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows) const override;
  void forward(const LayerContext& ctx, FeedForwardActivations& a, float* x_out, const float* x,
               int64_t rows, Tensor& partial, float loss_scale) override;
  void backward(const LayerContext& ctx, FeedForwardActivations& a, const SublayerBackward& g,
                float* d_x, const float* d_x_out, const float* x) override;
  void weight_pass(const LayerContext& ctx, FeedForwardActivations& a, int64_t rows,
                   float* gathered) override;

  bool regathers_fp32(kernels::Precision) const override { return true; }
  bool uses_projection_gradient() const override { return dense(); }
  int64_t norm_partial_floats() const override;
  int64_t saved_bytes(kernels::Precision precision, int64_t rows) const override;
  int64_t scratch_floats(kernels::Precision precision, int64_t rows) const override;
  int64_t pending_weight_floats(kernels::Precision precision, int64_t rows) const override;
  int64_t transient_bytes(kernels::Precision precision, int64_t rows) const override;
  std::optional<MoeLayerStatistics> moe_statistics(const FeedForwardActivations& a) const override;
  bool update_choice_bias(const std::vector<int64_t>& load, double rate) override;

 private:
  bool dense() const { return shared_.width() > 0; }
  // The routed experts' input over all rows: the norm output, gathered into `all_rows` on a
  // sharded layout.
  const float* routed_input(const LayerContext& ctx, const MoeLayerActivations& a, Tensor& all_rows,
                            int64_t rows) const;

  parallel::SequenceLayout layout_;
  Norm norm_;
  MoeMlp moe_;
  MoeBalancing balancing_;
  SwiGluProjections shared_;
  int64_t C_ = 0, layer_ = 0;
};

}  // namespace lattice::model
