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

// What a GPT-2 block's forward saves (rows = B·T, C = d_model, F = ffn_hidden, H = heads; under
// tensor parallelism A, F and H are this rank's; `local` = this rank's sequence rows, rows / tp
// under sequence parallelism, else rows).
struct Gpt2BlockActivations final : BlockActivations {
  Tensor ln1;                 // [local, C] LayerNorm 1 output (fp32; in bf16 only c_attn's in16)
  Tensor ln1_16, ln2_16;      // [local, C] bf16 LayerNorm outputs (bf16 sequence parallelism: the
                              // rows gathered into c_attn's and c_fc's in16, which is not kept)
  Tensor ln1_mean, ln1_rstd;  // [local]
  Tensor qkv;                 // [rows, 3C] fp32 q, k, v (fp32 training, cached inference)
  Tensor qkv16;               // [rows, 3C] bf16 q, k, v (bf16 training; qkv is then not kept)
  Tensor att;                 // [rows, C] attention output (dropped by selective checkpointing)
  Tensor lse;                 // [B, H, T] its log-sum-exp (dropped with it)
  Tensor x2;                  // [local, C] residual after attention
  Tensor ln2;                 // [local, C] LayerNorm 2 output (fp32; in bf16 only c_fc's in16)
  Tensor ln2_mean, ln2_rstd;  // [local]
  Tensor fc;                  // [rows, F] MLP pre-activation (fp32 only; bf16 never stores it)
  Tensor gelu;                // [rows, F] GELU output (fp32; in bf16 only c_proj's in16)
  Tensor gelu_slope16;        // [rows, F] bf16: the GELU's slope at the pre-activation
  LinearActivations c_attn, attn_proj, c_fc, mlp_proj;
  // Between backward_input and backward_weight: each Linear's output gradient. fp32: d_qkv [rows,
  // 3C], d_x2 [rows, C], d_fc [rows, F], d_y [rows, C] (all rows: under sequence parallelism
  // d_x2 and d_y are gathered); bf16: d_qkv, d_fc and d_y hold the rounded bf16 gradients (in the
  // first half of their floats), d_x2 stays fp32.
  Tensor d_qkv, d_x2, d_fc, d_y;
  void release() override;
};

class Gpt2Block final : public Block {
 public:
  Gpt2Block(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
            const TensorParallelGroup& tp);

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

 private:
  void weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in, int64_t B,
                   int64_t T) override;
  using Saved = Gpt2BlockActivations;
  // The forward pieces shared by training and cached inference: activation buffers for B·T rows;
  // LayerNorm 1 and the fused QKV projection; then, after attention has filled att, the output
  // projection, both residual adds, LayerNorm 2 and the MLP.
  // `cached`: for forward_cached, whose q, k, v go to the KV cache in fp32 whatever the precision.
  void prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T, bool cached);
  // LayerNorm 1 and c_attn into qkv (fp32, cached inference), or in bf16 training into qkv16
  // only, rounded chunk by chunk as the GEMM produces them.
  void qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows);
  // A LayerNorm on this rank's rows of x feeding the column-parallel `layer`, whose input is its
  // output over all rows — fp32: `out` [local, C] itself, or gathered from every rank into
  // `gathered` [rows, C] under sequence parallelism (*input set to it); bf16: written into the
  // layer's prepared bf16 input (gathered into it from out16 [local, C] under sequence
  // parallelism; *input null). Returns the all-gather, still in flight (column_parallel_forward
  // runs the GEMM on this rank's own rows meanwhile).
  TpCollective norm_into_column(const LayerContext& ctx, Linear& layer, LinearActivations& saved,
                                Tensor& out, Tensor& out16, Tensor& mean, Tensor& rstd,
                                const float* x, int weight, int bias, Tensor& gathered,
                                int64_t rows, const float** input);
  // Sequence parallelism: c_attn's or c_fc's input over all rows again for its weight gradient,
  // gathered (asynchronously: wait for the returned collective) from the saved LayerNorm output —
  // fp32 into `gathered` [rows, C] (*input set to it), bf16 into the layer's kept bf16 input
  // (*input null). Without sequence parallelism nothing moves: *input is the saved output.
  TpCollective regather_column_input(const LayerContext& ctx, Linear& layer,
                                     LinearActivations& saved, const Tensor& out,
                                     const Tensor& out16, float* gathered, int64_t rows,
                                     const float** input);
  // The attention core on the saved q, k, v into att and lse (forward, and its recomputation).
  void attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T);
  void backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                     const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                     BackwardScratch& scratch, bool defer) override;
  // bf16 backward of attention and c_attn, from d_att to d_ln (LayerNorm 1's output gradient):
  // attention writes c_attn's bf16 d_out (d_qkv_buffer, [rows, 3C] bf16) and its column sums;
  // `input_half_only` leaves c_attn's weight half to the caller.
  void attention_backward_bf16(const LayerContext& ctx, Saved& a, float* d_ln, const float* d_att,
                               float* d_qkv_buffer, int64_t B, int64_t T, bool input_half_only);
  void projection_and_mlp_forward(const LayerContext& ctx, Saved& a, float* x_out,
                                  const float* x_in, int64_t rows);
  // bf16 backward of the MLP from d_y (the block's output gradient over all rows) to d_ln
  // (LayerNorm 2's output gradient, a partial sum over tp under tensor parallelism), with c_proj's
  // input gradient and the GELU backward fused (Linear::backward_input_through_gelu_bf16);
  // d_fc_buffer holds c_fc's bf16 d_out [rows, F], d_y_buffer c_proj's bf16 d_out [rows, C].
  // `defer`: c_proj's weight half is left for backward_weight; `fc_input_half_only`: c_fc's too
  // (deferred, or run by the caller while the tp all-reduce of d_ln is in flight).
  void mlp_backward_bf16(const LayerContext& ctx, Saved& a, float* d_ln, const float* d_y,
                         float* d_fc_buffer, float* d_y_buffer, int64_t rows, bool defer,
                         bool fc_input_half_only);

  ParameterStore& store_;
  TensorParallelGroup tp_;
  // C: the model width (residuals, norms); on this tensor-parallel rank: heads_ attention heads of
  // head_dim_, A_ = heads_ · head_dim_ attention channels, F_ MLP channels.
  int64_t C_, heads_, head_dim_, A_ = 0, F_ = 0;
  float eps_;
  int ln1_weight_, ln1_bias_, ln2_weight_, ln2_bias_;
  Linear c_attn_, attn_proj_, c_fc_, mlp_proj_;
};

}  // namespace lattice::model
