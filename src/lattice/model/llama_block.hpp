// Llama transformer block: x + o_proj(attention(RoPE(q), RoPE(k), v)) over RMSNorm(x), then
// + down_proj(silu(gate_proj(·)) · up_proj(·)) over RMSNorm; grouped-query attention, no biases;
// parameters named as Hugging Face's LlamaModel ("model.layers.<i>.self_attn.q_proj.weight", ...).
// In a MoE layer (ModelConfig::is_moe_layer) the MLP is a MoeMlp (moe_mlp.hpp: Mixtral's or
// DeepSeek's names) plus, with shared experts, a dense SwiGLU of their width beside it.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

#include "lattice/kernels/rope_table.hpp"
#include "lattice/model/block.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/moe_mlp.hpp"

namespace lattice::model {

// What a Llama block's forward saves (rows = B·T, C = d_model, F = ffn_hidden, Hq / Hkv = query /
// key-value heads, kv = Hkv · head_dim; under tensor parallelism A = Hq · head_dim, F, Hq and Hkv
// are this rank's; `local` = this rank's sequence rows, rows / tp under sequence parallelism).
struct LlamaBlockActivations final : BlockActivations {
  Tensor n1, rstd1;    // [local, C], [local]: RMSNorm 1
  Tensor q, k, v;      // [rows, A], [rows, kv], [rows, kv]: q and k after RoPE
  Tensor att, lse;     // [rows, A], [B, Hq, T]: attention (dropped by selective checkpointing)
  Tensor x2;           // [local, C] residual after attention
  Tensor n2, rstd2;    // [local, C], [local]: RMSNorm 2
  Tensor gate, up, h;  // [rows, F] each: SwiGLU's inputs and output (a MoE layer: shared experts)
  MoeMlpActivations moe;    // a MoE layer's routing and experts
  MoeLossTerms moe_losses;  // a MoE layer's balancing losses and their router gradients
  LinearActivations q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  // Between backward_input and backward_weight: each Linear's output gradient (fp32, all rows:
  // under sequence parallelism d_x2 and d_y are gathered).
  Tensor d_q, d_k, d_v, d_x2, d_gate, d_up, d_y;
  void release() override;
};

class LlamaBlock final : public Block {
 public:
  LlamaBlock(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
             const TensorParallelGroup& tp, const kernels::RopeTable& rope,
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
  void weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in, int64_t B,
                   int64_t T) override;
  using Saved = LlamaBlockActivations;
  // The forward pieces shared by training and cached inference: activation buffers for B·T rows;
  // RMSNorm 1 and the q/k/v projections (before RoPE); then, after attention has filled att, the
  // output projection, both residual adds, RMSNorm 2 and the SwiGLU MLP.
  void prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T);
  void qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows);
  // An RMSNorm output over all rows, the column-parallel layers' input: `norm` itself, or gathered
  // from every rank's rows into `gathered` ([rows, C], returned) under sequence parallelism.
  // With `pending` null the gather blocks; otherwise *pending holds it, still in flight.
  const float* norm_rows(const Tensor& norm, float* gathered, int64_t rows, TpCollective* pending);
  // Column-parallel layers reading one norm output: each writes `out` ([rows, out_features]).
  struct ColumnLayer {
    Linear* layer;
    LinearActivations* saved;
    float* out;
  };
  // Their forward over all rows (column_parallel_forward): under sequence parallelism this rank's
  // own rows first, from `own_rows` (its norm output), while `gather` brings the others into
  // `all_rows`; without it one forward each over `all_rows`.
  void column_inputs_forward(const LayerContext& ctx, TpCollective& gather, const float* own_rows,
                             const float* all_rows, int64_t rows,
                             std::initializer_list<ColumnLayer> layers);
  // The attention core on the saved (rotated) q, k and v into att and lse.
  void attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T);
  void projection_and_mlp_forward(const LayerContext& ctx, Saved& a, float* x_out,
                                  const float* x_in, int64_t rows);
  // A MoE layer's input over all rows: RMSNorm 2's output, gathered into `all_rows` under
  // sequence parallelism.
  const float* moe_input(const LayerContext& ctx, const Saved& a, Tensor& all_rows, int64_t rows);
  void backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                     const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                     BackwardScratch& scratch, bool defer) override;

  ParameterStore& store_;
  const kernels::RopeTable& rope_;
  TensorParallelGroup tp_;
  // C: the model width (residuals, norms); on this tensor-parallel rank: heads_ query and
  // kv_heads_ key/value heads of head_dim_, A_ = heads_ · head_dim_ query channels, F_ dense MLP
  // channels (a MoE layer: its shared experts', 0 without).
  int64_t C_, heads_, kv_heads_, head_dim_, A_ = 0, F_ = 0;
  int64_t layer_;  // the global block index
  float eps_;
  int norm1_weight_, norm2_weight_;
  Linear q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, up_proj_, down_proj_;
  std::optional<MoeMlp> moe_;  // a MoE layer's routed experts
  MoeBalancing balancing_;
};

}  // namespace lattice::model
