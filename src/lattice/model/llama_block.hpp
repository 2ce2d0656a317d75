// Llama transformer block: x + o_proj(attention(RoPE(q), RoPE(k), v)) over RMSNorm(x), then
// + down_proj(silu(gate_proj(·)) · up_proj(·)) over RMSNorm; grouped-query attention, no biases;
// parameters named as Hugging Face's LlamaModel ("model.layers.<i>.self_attn.q_proj.weight", ...).
#pragma once

#include <string>

#include "lattice/kernels/cpu/rope.hpp"
#include "lattice/model/block.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::model {

class LlamaBlock final : public Block {
 public:
  LlamaBlock(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
             const TensorParallelGroup& tp, const kernels::RopeTable& rope);

  void forward(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
               int64_t T) override;
  void backward(const LayerContext& ctx, float* d_x_in, const float* d_x_out, const float* x_in,
                int64_t B, int64_t T, BackwardScratch& scratch) override;
  void release_activations() override;
  void forward_cached(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                      int64_t n, KvCache& cache, int64_t cache_layer) override;

 private:
  // The forward pieces shared by training and cached inference: activation buffers for B·T rows;
  // RMSNorm 1 and the q/k/v projections (before RoPE); then, after attention has filled att_, the
  // output projection, both residual adds, RMSNorm 2 and the SwiGLU MLP.
  void prepare_activations(const LayerContext& ctx, int64_t B, int64_t T);
  void qkv_forward(const LayerContext& ctx, const float* x_in, int64_t rows);
  void projection_and_mlp_forward(const LayerContext& ctx, float* x_out, const float* x_in,
                                  int64_t rows);

  ParameterStore& store_;
  const kernels::RopeTable& rope_;
  int64_t C_, F_, heads_, kv_heads_, head_dim_;
  float eps_;
  int norm1_weight_, norm2_weight_;
  Linear q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, up_proj_, down_proj_;
  // Saved activations (q and k after RoPE).
  Tensor n1_, rstd1_, q_, k_, v_, att_, lse_, x2_, n2_, rstd2_, gate_, up_, h_;
};

}  // namespace lattice::model
