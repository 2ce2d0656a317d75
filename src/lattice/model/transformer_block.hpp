// TransformerBlock: the one block type. A pre-norm transformer block composed from a
// BlockDescription: h = x + attention(norm1(x)); out = h + mlp(norm2(h)) (Megatron-core's
// TransformerLayer, torchtitan's TransformerBlock), the attention and MLP components each with
// their pre-norm. It is built on a SequenceLayout and the splits its description's parallelize
// plan gives (parallel/tensor/), and calls whichever ContextAttention the context hands it: the
// block and its components are written for one rank.
#pragma once

#include <memory>

#include "lattice/model/block.hpp"
#include "lattice/model/block_description.hpp"

namespace lattice::model {

// What a block's forward saves (local = the layout's own rows of rows = B·T, C = d_model).
struct TransformerBlockActivations final : BlockActivations {
  AttentionActivations attention;
  std::unique_ptr<FeedForwardActivations> mlp;
  Tensor x2;  // [local, C] the residual after attention
  void release() override;
};

class TransformerBlock final : public Block {
 public:
  // `rope`: the Transformer's RoPE table (needed when the description's attention is rotary);
  // `ep`: the expert-parallel group a MoE layer's experts are split over.
  TransformerBlock(ParameterStore& store, const BlockDescription& description, int64_t layer_index,
                   const parallel::SequenceLayout& layout, const kernels::RopeTable* rope,
                   const ExpertParallelGroup& ep = {});

  std::unique_ptr<BlockActivations> make_activations() const override;
  void forward(const LayerContext& ctx, BlockActivations& saved, float* x_out, const float* x_in,
               int64_t B, int64_t T) override;
  void forward_cached(const LayerContext& ctx, BlockActivations& work, float* x_out,
                      const float* x_in, int64_t B, int64_t n, KvCache& cache,
                      int64_t cache_layer) override;
  int64_t saved_bytes(kernels::Precision precision, int64_t B, int64_t T) const override;
  int64_t attention_output_bytes(int64_t B, int64_t T) const override;
  int64_t scratch_bytes(kernels::Precision precision, int64_t B, int64_t T) const override;
  int64_t transient_bytes(kernels::Precision precision, int64_t B, int64_t T) const override;
  int64_t pending_weight_bytes(kernels::Precision precision, int64_t B, int64_t T) const override;
  std::optional<MoeLayerStatistics> moe_statistics(const BlockActivations& saved) const override;
  bool update_choice_bias(const std::vector<int64_t>& load, double rate) override;

 private:
  using Saved = TransformerBlockActivations;
  void backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                     const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                     BackwardScratch& scratch, bool defer) override;
  void weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in, int64_t B,
                   int64_t T) override;
  // Sizes the saved tensors of both sub-layers and the residual between them.
  void prepare(const LayerContext& ctx, Saved& a, int64_t B, int64_t T, bool cached) const;
  // Whether a sharded layout gathers a norm output again in fp32 for the weight gradients.
  bool regathers_fp32(kernels::Precision precision) const;

  parallel::SequenceLayout layout_;
  int64_t C_;
  Attention attention_;
  std::unique_ptr<FeedForward> mlp_;
};

}  // namespace lattice::model
