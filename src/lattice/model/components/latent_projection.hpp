// The input projections of DeepSeek-V2/V3's multi-head latent attention (MLA; Hugging Face's
// DeepseekV3Attention), from the attention sub-layer's normed input x [rows, C]:
//   q          = q_b_proj(q_a_layernorm(q_a_proj(x)))   (or q_proj(x) without a query rank),
//                per head [q_nope | q_pe] (qk_nope_head_dim + qk_rope_head_dim)
//   [c | k_pe] = kv_a_proj_with_mqa(x)                  (kv_lora_rank | one qk_rope_head_dim head)
//   [k_nope | v] per head = kv_b_proj(kv_a_layernorm(c))
//   k          = per head [k_nope | k_pe], k_pe shared by every head
// with RoPE (Lattice's rotate_half layout) on q_pe and k_pe only. It writes q [rows, heads·qk],
// k [rows, heads·qk] and v [rows, heads·v_head_dim] where the attention core reads q, k, v apart,
// and its backward takes their gradients back into its weights and the input gradient. The two
// projections that read x (q_proj or q_a_proj, and kv_a_proj_with_mqa) run their weight halves
// when the block says (deferred for zero-bubble schedules); the inner ones (q_b_proj, kv_b_proj)
// and the latent norms run whole in the input half. Under tensor parallelism (Megatron-style, as
// Hugging Face's tp plan for DeepseekV3) each rank holds its heads: q_proj / q_b_proj and kv_b_proj
// are column-split by heads, while q_a_proj, q_a_layernorm, kv_a_proj_with_mqa and kv_a_layernorm
// are whole on every rank and run redundantly on the whole (under sequence parallelism gathered)
// input; their gradients are partial sums over the ranks' heads, summed over the group (see
// backward). Under context parallelism (ctx.context) the rows are this rank's runs of each
// sequence and RoPE rotates them at the runs' positions (rope_at_runs), forward and backward.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/core/tensor.hpp"
#include "lattice/kernels/rope_table.hpp"
#include "lattice/model/components/norm.hpp"
#include "lattice/model/components/normed_input.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

// The latent option of an attention sub-layer (AttentionDescription::latent): its ranks and head
// widths and its parameter names (Hugging Face's, relative to the block's prefix). The query
// projection without a rank is AttentionDescription::q; the output projection is its `out`.
struct LatentAttentionDescription {
  int64_t q_lora_rank = 0;   // 0: one q_proj
  int64_t kv_lora_rank = 0;  // > 0: multi-head latent attention
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0;
  std::string q_a = "self_attn.q_a_proj", q_a_norm = "self_attn.q_a_layernorm";
  std::string q_b = "self_attn.q_b_proj";
  std::string kv_a = "self_attn.kv_a_proj_with_mqa", kv_a_norm = "self_attn.kv_a_layernorm";
  std::string kv_b = "self_attn.kv_b_proj";
  // The latent norms' epsilon: Hugging Face's DeepseekV3RMSNorm default, which they keep whatever
  // the config's rms_norm_eps (the block's norms take that one).
  float norm_eps = 1e-6f;
  // The factor on the softmax scale 1/sqrt(qk_head_dim): yarn's mscale² (Hugging Face's
  // yarn_apply_mscale, DeepSeek-V3's long-context checkpoints). Applied to the queries after
  // RoPE (q·k·scale·f = (f·q)·k·scale), and to their gradient before RoPE's inverse.
  float softmax_scale_factor = 1.0f;

  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// What its forward saves (rows = B·T).
struct LatentActivations {
  Tensor q_a;                 // [rows, q_rank] q_a_proj's output (the query norm's input)
  NormActivations q_a_norm;   // its fp32 output (fp32 precision) and rstd
  Tensor compressed;          // [rows, kv_rank] c, the latent norm's input
  NormActivations kv_a_norm;  // its fp32 output (fp32 precision) and rstd
  // q_proj's or q_a_proj's (in bf16 its in16 is the shared bf16 input the attention's norm
  // writes), kv_a_proj_with_mqa's, and the inner projections' (bf16: the latent norms' outputs).
  LinearActivations q_input, kv_a, q_b, kv_b;
  // Between backward_input and backward_weight: the output gradients of the two projections that
  // read x ([rows, heads·qk] or [rows, q_rank]; [rows, kv_rank + qk_rope]).
  Tensor d_q_input, d_kv_a;
  void release();
};

// The attention core's gradients of q, k, v (scratch of the block's backward).
struct LatentGradients {
  float *q = nullptr, *k = nullptr, *v = nullptr;
};

// The output gradients of the two projections that read x, for their weight halves: scratch when
// they run in the same backward, the activations' kept d_q_input and d_kv_a when deferred.
struct LatentInputGradients {
  const float *q_input = nullptr, *kv_a = nullptr;
};

class LatentProjection {
 public:
  LatentProjection() = default;
  // Declares its parameters under `prefix` in Hugging Face's module order; `q_name` is q_proj's
  // name (no query rank). `heads`: the whole model's, split over the layout's ranks (which must
  // divide them) with the head-reading projections split as `head_split` says (the plan's
  // attention input: column). `rope`: the table of qk_rope_head_dim-wide heads.
  LatentProjection(ParameterStore& store, const std::string& prefix,
                   const LatentAttentionDescription& d, const std::string& q_name, int64_t d_model,
                   int64_t heads, int64_t v_head_dim, const kernels::RopeTable* rope,
                   const parallel::SequenceLayout& layout = {},
                   parallel::TensorSplit head_split = parallel::TensorSplit::column);

  bool enabled() const { return kv_rank_ > 0; }
  // The projection whose bf16 input the attention's norm writes (q_proj or q_a_proj); kv_a reads
  // the same rows.
  Linear& input_reader() { return has_q_rank() ? q_a_ : q_; }

  void prepare(const LayerContext& ctx, LatentActivations& a, int64_t rows) const;
  // q, k, v from the normed input of B sequences of T tokens: fp32 `in` [rows, C], or in bf16
  // precision the shared bf16 `in16` (input_reader's prepared input); the tokens at positions
  // [position_offset, position_offset + T) for RoPE (KV-cached generation's new tokens; under
  // context parallelism the runs' positions, offset 0).
  void forward(const LayerContext& ctx, LatentActivations& a, float* q, float* k, float* v,
               const float* in, const lattice::bf16* in16, int64_t B, int64_t T,
               int64_t position_offset = 0);
  // Where the attention core writes d q, d k, d v.
  LatentGradients attention_gradients(const SublayerBackward& g, LatentActivations& a) const;
  // From the attention core's gradients (overwritten: RoPE's inverse runs in place) into the
  // weights and g.d_rows, the input gradient; the two x-reading projections' weight halves run
  // here unless g.split (then weight_halves, with the gradients it returns, or weight_pass when
  // deferred), reading `in` / `in16` as forward did.
  LatentInputGradients backward(const LayerContext& ctx, LatentActivations& a,
                                const SublayerBackward& g, const LatentGradients& d,
                                const float* in, const lattice::bf16* in16);
  // The two x-reading projections' weight halves from their output gradients `d`.
  void weight_halves(const LayerContext& ctx, LatentActivations& a, const LatentInputGradients& d,
                     const float* in, const lattice::bf16* in16, int64_t rows);
  // The deferred weight halves, from the kept gradients (released after).
  void weight_pass(const LayerContext& ctx, LatentActivations& a, const float* in,
                   const lattice::bf16* in16, int64_t rows);

  // The activation-memory terms beyond q, k, v (Attention counts those).
  int64_t saved_bytes(kernels::Precision precision, int64_t rows) const;
  int64_t scratch_floats(int64_t rows) const;  // every buffer of backward (d q, k, v included)
  int64_t pending_weight_floats(int64_t rows) const;
  int64_t forward_transient_bytes(int64_t rows) const;  // kv_a's and kv_b's outputs

 private:
  bool has_q_rank() const { return q_rank_ > 0; }
  int64_t q_input_width() const { return has_q_rank() ? q_rank_ : heads_ * qk_; }
  // RoPE (or its inverse) on the rope channels of every head of q [rows, heads·qk], at the rows'
  // positions (forward's).
  void rotate_queries(const LayerContext& ctx, float* q, int64_t B, int64_t T, bool inverse,
                      int64_t position_offset = 0) const;

  // The sum over the group of the replicated x-reading projections' output gradients (kept for
  // their weight halves); nothing on one rank.
  void sum_replicated_output_gradients(float* d_q_input, float* d_kv_a, int64_t rows) const;

  parallel::SequenceLayout layout_;
  const kernels::RopeTable* rope_ = nullptr;
  Linear q_, q_a_, q_b_, kv_a_, kv_b_;
  Norm q_a_norm_, kv_a_norm_;
  // heads (this rank's); qk = nope + rope channels of a query-key head; v of a value head; the
  // ranks.
  int64_t C_ = 0, heads_ = 0, nope_ = 0, rope_dim_ = 0, qk_ = 0, v_ = 0, q_rank_ = 0, kv_rank_ = 0;
  float softmax_scale_factor_ = 1.0f;  // on the queries after RoPE (see the description)
};

}  // namespace lattice::model
