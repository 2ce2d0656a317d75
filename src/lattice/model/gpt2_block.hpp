// GPT-2 transformer block: x + attn(LN1(x)), then + MLP(LN2(·)) with GELU (tanh), biases
// everywhere, fused c_attn (q, k, v) projection; parameters named as Hugging Face's GPT2Model
// ("transformer.h.<i>.ln_1.weight", ".attn.c_attn.weight", ...). Note: Hugging Face stores GPT-2's
// Conv1D weights as [in, out]; Lattice stores every weight [out, in] and transposes on export.
#pragma once

#include <string>
#include <vector>

#include "lattice/model/block.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::model {

class Gpt2Block final : public Block {
 public:
  Gpt2Block(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
            const TensorParallelGroup& tp);

  void forward(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
               int64_t T) override;
  void backward(const LayerContext& ctx, float* d_x_in, const float* d_x_out, const float* x_in,
                int64_t B, int64_t T, BackwardScratch& scratch) override;
  void release_activations() override;
  void forward_cached(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                      int64_t n, KvCache& cache, int64_t cache_layer) override;

 private:
  // The forward pieces shared by training and cached inference: activation buffers for B·T rows;
  // LayerNorm 1 and the fused QKV projection; then, after attention has filled att_, the output
  // projection, both residual adds, LayerNorm 2 and the MLP.
  // `cached`: for forward_cached, whose q, k, v go to the KV cache in fp32 whatever the precision.
  void prepare_activations(const LayerContext& ctx, int64_t B, int64_t T, bool cached);
  // LayerNorm 1 and c_attn into qkv_ (fp32, cached inference), or in bf16 training into qkv16_
  // only, rounded chunk by chunk as the GEMM produces them.
  void qkv_forward(const LayerContext& ctx, const float* x_in, int64_t rows);
  // bf16 backward of attention and c_attn, from d_att to d_ln (LayerNorm 1's output gradient):
  // attention writes c_attn's bf16 d_out (d_qkv_buffer, [rows, 3C] bf16) and its column sums.
  void attention_backward_bf16(const LayerContext& ctx, float* d_ln, const float* d_att,
                               float* d_qkv_buffer, int64_t B, int64_t T);
  void projection_and_mlp_forward(const LayerContext& ctx, float* x_out, const float* x_in,
                                  int64_t rows);
  // bf16 forward of LayerNorm 2 and the MLP from x2_ to x_out (before the residual add), with
  // c_fc's GEMM and the GELU fused in row chunks.
  void mlp_forward_bf16(const LayerContext& ctx, float* x_out, int64_t rows);
  // bf16 backward of the MLP from d_x_out to d_ln (LayerNorm 2's output gradient), with c_proj's
  // input gradient and the GELU backward fused in row chunks; d_fc_buffer holds c_fc's bf16 d_out
  // [rows, F], d_y_buffer c_proj's bf16 d_out [rows, C].
  void mlp_backward_bf16(const LayerContext& ctx, float* d_ln, const float* d_x_out,
                         float* d_fc_buffer, float* d_y_buffer, int64_t rows);
  // Rows per chunk of the fused GEMMs (c_attn and its rounding, the MLP forward and backward): a
  // chunk's fp32 output (rows x 3C, pre-activation or d_gelu rows x F) stays in cache.
  static constexpr int64_t kChunkRows = 256;

  ParameterStore& store_;
  int64_t C_, F_, heads_;
  float eps_;
  int ln1_weight_, ln1_bias_, ln2_weight_, ln2_bias_;
  Linear c_attn_, attn_proj_, c_fc_, mlp_proj_;
  // Saved activations.
  Tensor ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, lse_, x2_, ln2_, ln2_mean_, ln2_rstd_, fc_, gelu_;
  Tensor gelu_slope16_;  // bf16: the GELU's slope at the pre-activation, for backward
  Tensor qkv16_;         // bf16 training: q, k, v rounded (qkv_ is then not kept)
  // attention_backward_bf16's per-batch column sums of c_attn's d_out (its bias gradient).
  std::vector<double> qkv_column_sums_;
  // mlp_backward_bf16's per-chunk column sums of c_fc's d_out (its bias gradient).
  std::vector<double> chunk_column_sums_;
};

}  // namespace lattice::model
