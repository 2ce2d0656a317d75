// The kernel interface: every operation the model, the optimizer and the gradient norm compute on
// tensors, declared once. A backend implements it for one device (kernels/cpu/cpu_ops.hpp: oneDNN
// GEMMs and Lattice's AVX2 / AVX-512 / AMX kernels chosen at run time); a CUDA backend will be a
// new folder implementing the same class, with no change to the model. All pointers are the
// backend's device memory (memory(): its allocation, zero-fill and copies); sizes are elements.
// Every layer reaches it as LayerContext::ops; the trainer, the optimizer, ZeRO and the gradient
// norm hold one made by kernels/make_ops.hpp.
//
// How an op is computed (thread lanes, row chunks sized to a cache, tiles) is the backend's own:
// the ops below name what is computed, and the fused ones name which intermediate never needs to
// be stored (as cuBLASLt's epilogues do for a GEMM's bias, GELU and its auxiliary output). Where a
// comment promises bits (thread-count independence, equality with an unfused sequence), every
// backend keeps that promise on its own device.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lattice/core/device_memory.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/kernels/attention_shape.hpp"
#include "lattice/kernels/linear_operands.hpp"
#include "lattice/kernels/moe_routing.hpp"
#include "lattice/kernels/optimizer_operands.hpp"
#include "lattice/kernels/precision.hpp"
#include "lattice/kernels/rope_table.hpp"
#include "lattice/kernels/vocab_range.hpp"

namespace lattice::kernels {

// bf16 training: when and how the LM head's backward runs inside its forward, so that the logits'
// gradient [rows, vocab] is never stored, at the cost of weight-gradient partials [vocab,
// d_model] fp32 (one per lane of the backend's split):
//   always:        alongside the forward, on the stored-nowhere logits of each part of the rows
//   vocab_blocked: in blocks of the vocabulary with the logits computed twice (where the backend
//                  has such a kernel, else as always)
//   never:         the backward reads the stored bf16 logits' gradient
//   when_smaller (the default): vocab_blocked where it applies, else always, when the partials
//                  take no more memory than the bf16 logits gradient they replace; else never.
enum class HeadFusion { when_smaller, always, vocab_blocked, never };

// How a backend runs the LM head and its loss for `rows` rows in bf16 (Ops::plan_head_loss_bf16).
struct HeadLossPlan {
  // The head's backward runs inside the forward: head_loss_bf16 writes d_in and the weight
  // gradient's partials; the caller adds the partials to the gradient in its backward.
  bool backward_in_forward = false;
  // How many [vocab, d_model] fp32 partials head_loss_bf16 writes (backward_in_forward only).
  int weight_gradient_partials = 0;
  // The head runs in blocks of the vocabulary with its logits computed twice (HeadFusion's
  // vocab_blocked took effect on this backend).
  bool vocab_blocked = false;
  // The backend's own: which of its kernels runs the head, and its rows per part.
  int kernel = 0;
  int64_t chunk_rows = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // The device whose memory every pointer below is in.
  virtual Device device() const = 0;
  // One phrase for run banners, e.g. "cpu: AMX-BF16 (oneDNN GEMMs, Lattice's AMX kernels)".
  virtual std::string describe() const = 0;
  // One line for a bf16 run's banner: where this backend's bf16 products run.
  virtual std::string describe_bf16() const = 0;
  // The backend's bf16 products run on its fp32 units (the operands widened): a bf16 run's peak is
  // the fp32 one, and a bf16 GEMM's rate is measured on fp32 operands.
  virtual bool bf16_on_fp32_units() const = 0;
  // Bytes of scratch the backend holds now (grow-only), for memory accounting.
  virtual int64_t scratch_bytes() const = 0;
  // The device memory every pointer of these ops is in: the trainer's parameters, gradients,
  // optimizer state and activations are allocated from it (Tensor(shape, dtype, memory(), ...)).
  virtual DeviceMemory& memory() = 0;

  // ---- Linear: out[M,N] = in[M,K] · weight[N,K]^T (+ bias[N]), weights stored [out, in].

  // out overwritten. bf16: `keep` holds the caller-owned bf16 copies (linear_operands.hpp); with a
  // null fp32 `in`, keep.in already holds the rounded input.
  virtual void linear_forward(float* out, const float* in, const float* weight, const float* bias,
                              int64_t M, int64_t K, int64_t N, Precision precision,
                              const Bf16Operands& keep) = 0;
  // Given d_out[M,N]: d_in[M,K] = d_out · weight (overwritten; skipped when null), d_weight[N,K]
  // += d_out^T · in and d_bias[N] += the column sums of d_out (accumulated; skipped when null).
  // The input half (B) is the call with only d_in, the weight half (W) the call with only d_weight
  // and d_bias; B then W equals the call with all three bit for bit. bf16: `rounded` replaces the
  // rounding of in / weight / d_out by the caller's copies (d_out may then be null unless d_bias
  // is wanted).
  virtual void linear_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                               const float* in, const float* weight, int64_t M, int64_t K,
                               int64_t N, Precision precision, const Bf16Operands& rounded) = 0;
  void linear_backward_input(float* d_in, const float* d_out, const float* weight, int64_t M,
                             int64_t K, int64_t N, Precision precision,
                             const Bf16Operands& rounded) {
    linear_backward(d_in, nullptr, nullptr, d_out, nullptr, weight, M, K, N, precision, rounded);
  }
  void linear_backward_weight(float* d_weight, float* d_bias, const float* d_out, const float* in,
                              const float* weight, int64_t M, int64_t K, int64_t N,
                              Precision precision, const Bf16Operands& rounded) {
    linear_backward(nullptr, d_weight, d_bias, d_out, in, weight, M, K, N, precision, rounded);
  }

  // ---- Fused bf16 Linears (bf16 precision; in16 is the layer's bf16 input [M,K]).

  // out16[M,N] = bf16(in16 · weight^T + bias): the fp32 output is never stored (GPT-2's packed
  // q, k, v, which attention reads in bf16). Bit for bit the rounding of linear_forward's output.
  virtual void linear_forward_to_bf16(lattice::bf16* out16, const lattice::bf16* in16,
                                      WeightOperand weight, const float* bias, int64_t M, int64_t K,
                                      int64_t N) = 0;
  // The first layer of a GELU MLP: pre = in16 · weight^T + bias, then gelu16 = bf16(gelu(pre))
  // and slope16 = bf16(gelu'(pre)) (gelu_forward_bf16_with_slope); `pre` is never stored.
  virtual void linear_gelu_forward_bf16(lattice::bf16* gelu16, lattice::bf16* slope16,
                                        const lattice::bf16* in16, WeightOperand weight,
                                        const float* bias, int64_t M, int64_t K, int64_t N) = 0;
  // The second layer's input gradient through the GELU: d_gelu[M,K] = d_out16[M,N] · weight[N,K]
  // (never stored), then d_pre16 = bf16(d_gelu · slope16) and, when pre_bias_grad is given,
  // pre_bias_grad[K] += the column sums of d_gelu · slope16 (the first layer's bias gradient),
  // summed in an order fixed by M alone (the same for any thread count).
  virtual void linear_backward_input_through_gelu_bf16(lattice::bf16* d_pre16, float* pre_bias_grad,
                                                       const lattice::bf16* d_out16,
                                                       WeightOperand weight,
                                                       const lattice::bf16* slope16, int64_t M,
                                                       int64_t K, int64_t N) = 0;
  // d_out16[M,N] = bf16(d_out) and, when d_bias is given, d_bias[N] += d_out's column sums, in
  // one pass (row by row in double: independent of the thread count).
  virtual void round_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out,
                                      int64_t M, int64_t N) = 0;

  // ---- LM head and loss.

  // loss_r = logsumexp(logits[r,:]) - logits[r, targets[r]]; rows with a negative target are
  // ignored. Returns the sum of the row losses (in double, row order).
  virtual double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows,
                                       int64_t V) = 0;
  // As above, and d_logits = (softmax - onehot) · grad_scale (d_logits may alias logits).
  virtual double cross_entropy_forward_backward(float* d_logits, const float* logits,
                                                const int32_t* targets, int64_t rows, int64_t V,
                                                float grad_scale) = 0;
  // How head_loss_bf16 runs for `rows` rows of width K over V classes (with_gradient: the loss's
  // gradient is wanted), given the caller's fusion choice.
  virtual HeadLossPlan plan_head_loss_bf16(int64_t rows, int64_t K, int64_t V, bool with_gradient,
                                           HeadFusion fusion) const = 0;
  // The head's logits in16[rows,K] · weight[V,K]^T and their cross-entropy against targets, the
  // logits never stored whole. Returns the summed loss (row order). With grad_scale != 0 the
  // gradient of grad_scale · loss: when plan.backward_in_forward, d_in[rows,K] (overwritten) and
  // the weight gradient as plan.weight_gradient_partials [V,K] partials in weight_grad_partials
  // (overwritten; add them with add_partials), else the logits' gradient rounded to bf16 in
  // d_logits16 [rows,V] for linear_backward.
  virtual double head_loss_bf16(const HeadLossPlan& plan, const lattice::bf16* in16,
                                WeightOperand weight, int64_t rows, int64_t K, int64_t V,
                                const int32_t* targets, float grad_scale, float* d_in,
                                float* weight_grad_partials, lattice::bf16* d_logits16) = 0;
  // Vocabulary-parallel cross-entropy over a tensor-parallel rank's logits [rows, V_local] of the
  // vocabulary rows `vocab` (columns [0, valid) real, the rest padding that never counts); the
  // caller reduces the rows' max (MAX), then their sums and target logits (SUM) across the group
  // between the calls (kernels/cpu/cross_entropy_vocab_slice.hpp states each).
  virtual void vocab_slice_row_max(float* row_max, const float* logits, int64_t rows,
                                   int64_t V_local, int64_t valid) = 0;
  virtual void vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                                    const float* row_max, const int32_t* targets, int64_t rows,
                                    int64_t V_local, int64_t valid, VocabRange vocab) = 0;
  // The summed loss (row order) and, when d_logits is given, grad_scale x its gradient.
  virtual double vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                                  const float* row_sum, const float* target_logit,
                                  const int32_t* targets, int64_t rows, int64_t V_local,
                                  int64_t valid, VocabRange vocab, float grad_scale) = 0;
  // accumulator[c] += the sum over p (in order, in double) of partials[p·stride + c], c < numel.
  virtual void add_partials(float* accumulator, const float* partials, int64_t count, int64_t numel,
                            int64_t stride) = 0;

  // ---- Attention (attention_shape.hpp). out [batch, q_len, q_heads·head_dim], lse [batch,
  // q_heads, q_len]; Precision::bf16 rounds q, k, v and the probabilities before the products.

  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& shape, Precision precision,
                                 const AttentionOptions& options) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* d_out,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& shape,
                                  Precision precision, const AttentionOptions& options) = 0;
  // q, k, v already bf16 (a projection's output rounded as produced); equal to the Precision::bf16
  // calls on the fp32 values these round from.
  virtual void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q,
                                      const lattice::bf16* k, const lattice::bf16* v,
                                      const AttentionShape& shape,
                                      const AttentionOptions& options) = 0;
  // dq, dk, dv rounded to bf16. When q, k, v are one packed projection's output ([q | k | v] per
  // token) and qkv_bias_grad is given, qkv_bias_grad[(q_heads + 2·kv_heads)·head_dim] += the
  // column sums of the unrounded dq | dk | dv: that projection's bias gradient, summed in an order
  // fixed by the shape alone.
  virtual void attention_backward_bf16(lattice::bf16* dq, lattice::bf16* dk, lattice::bf16* dv,
                                       float* qkv_bias_grad, const float* d_out,
                                       const lattice::bf16* q, const lattice::bf16* k,
                                       const lattice::bf16* v, const float* out, const float* lse,
                                       const AttentionShape& shape,
                                       const AttentionOptions& options) = 0;
  // Folds a partial result over one block of keys into a running one (exactly, through the
  // log-sum-exp): ring attention and chunked long sequences.
  virtual void attention_merge_partial(float* out, float* lse, const float* part_out,
                                       const float* part_lse, int64_t batch, int64_t q_len,
                                       int64_t q_heads, int64_t head_dim) = 0;

  // ---- Mixture-of-experts routing (moe_routing.hpp): scores, each token's top_k experts and
  // their weights, the statistics the balancing losses and metrics read; the backward writes the
  // logits' gradient through the weights and the balancing losses. Independent of the thread count.

  virtual void moe_router_forward(int32_t* experts, float* weights, float* scores,
                                  const float* logits, const float* bias, const RouterShape& shape,
                                  const RouterStatistics& stats) = 0;
  virtual void moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                                   const float* scores, const float* logits,
                                   const RouterShape& shape, const RouterLossGradients& losses) = 0;

  // Around the expert GEMMs (moe_dispatch.hpp's slots; kernels/cpu/moe_rows.hpp has the full
  // contracts): the gather of token rows into expert order and the weighted combine back, and
  // their backwards.
  virtual void moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots,
                          int64_t C) = 0;
  virtual void moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of,
                                   int64_t tokens, int64_t top_k, int64_t C) = 0;
  virtual void moe_combine(float* y, const float* expert_out, const float* weights,
                           const int32_t* slot_of, int64_t tokens, int64_t top_k, int64_t C) = 0;
  virtual void moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                                    const float* expert_out, const float* weights,
                                    const int32_t* slot_of, int64_t tokens, int64_t top_k,
                                    int64_t C) = 0;

  // ---- Norms over the last dimension C of [rows, C]. Backwards: d_in overwritten (+
  // residual_grad when given, in the same pass), d_weight / d_bias accumulated; bit-identical for
  // any thread count.

  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                                 const float* weight, const float* bias, int64_t rows, int64_t C,
                                 float eps) = 0;
  // The output rounded to bf16 (the next bf16 GEMM's input): no fp32 output is written.
  virtual void layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                                      const float* weight, const float* bias, int64_t rows,
                                      int64_t C, float eps) = 0;
  virtual void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                                  const float* in, const float* weight, const float* mean,
                                  const float* rstd, int64_t rows, int64_t C,
                                  const float* residual_grad) = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                               int64_t rows, int64_t C, float eps) = 0;
  // The output rounded to bf16 (the next bf16 GEMMs' input), bit for bit the rounding of
  // rmsnorm_forward's, with the same rstd: no fp32 output is written.
  virtual void rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in,
                                    const float* weight, int64_t rows, int64_t C, float eps) = 0;
  virtual void rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                                const float* weight, const float* rstd, int64_t rows, int64_t C,
                                const float* residual_grad) = 0;

  // ---- Activations (GELU in its tanh form, SwiGLU = silu(gate) · up) and RoPE.

  virtual void gelu_forward(float* out, const float* in, int64_t n) = 0;
  virtual void gelu_backward(float* d_in, const float* d_out, const float* in, int64_t n) = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) = 0;
  virtual void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                               const float* up, int64_t n) = 0;
  // In place on x [batch, seq, heads, head_dim] (strides in elements), token t at position
  // pos_offset + t; inverse rotates back (the backward).
  virtual void rope(const RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
                    int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse) = 0;

  // ---- Embedding: out[b,t,:] = wte[tokens[b,t],:] (+ wpe[pos_offset + t,:]); the backward sums
  // each row in token order (deterministic). tokens are in host memory, checked by the caller.
  // wte holds the vocabulary rows `vocab` (a tensor-parallel slice; a token outside it gives a
  // zero row, + wpe, and no gradient).

  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t B, int64_t T, int64_t C,
                                 int64_t pos_offset, VocabRange vocab) = 0;
  virtual void embedding_backward(float* d_wte, float* d_wpe, const float* d_out,
                                  const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                                  VocabRange vocab) = 0;

  // ---- Element-wise.

  virtual void add_inplace(float* accumulator, const float* x, int64_t n) = 0;
  virtual void copy(float* out, const float* in, int64_t n) = 0;
  // out[i] = in[i] · factor, one fp32 product each (a gradient bucket averaged into its staging).
  virtual void scale_copy(float* out, const float* in, int64_t n, float factor) = 0;
  virtual void fill_zero(float* x, int64_t n) = 0;
  // x[i] = value (a log-sum-exp started at -infinity before any key).
  virtual void fill(float* x, int64_t n, float value) = 0;
  virtual void convert_to_bf16(lattice::bf16* out, const float* in, int64_t n) = 0;
  // Exact (every bf16 is an fp32).
  virtual void convert_to_f32(float* out, const lattice::bf16* in, int64_t n) = 0;

  // ---- Optimizer and gradient norm.

  // AdamW on every tensor, PyTorch's arithmetic bit for bit (kernels/cpu/adamw.hpp); grad_scale
  // multiplies each gradient first (clipping).
  virtual void adamw_update(std::span<const AdamWTensor> tensors, int64_t step,
                            float grad_scale) = 0;
  // The sum over runs, in order, of each run's sum of squares (double, fixed chunks): independent
  // of the thread count.
  virtual double sum_of_squares(std::span<const FloatRun> runs) = 0;
  // sums[i] = sum_of_squares of runs[i] alone, bit for bit, for every run in one call (the
  // gradient norm's per-chunk partial sums, spread over the threads).
  virtual void sum_of_squares_each(std::span<const FloatRun> runs, double* sums) = 0;
};

}  // namespace lattice::kernels
