// The attention sub-layer of a transformer block, x_out = x + out(attention(qkv(norm(x)))), with
// its pre-norm: multi-head attention with q, k and v from one packed projection (GPT-2's c_attn,
// [q | k | v] per token) or from three (Llama's q_proj, k_proj, v_proj: grouped-query attention,
// key/value heads shared by groups of query heads), rotary positions on q and k or none, biases on
// the input or output projections or none, a sliding window (Mistral's) or none, a per-head q/k
// RMSNorm (Qwen 3's) or none, value heads as wide as the query-key heads or of their own width
// (DeepSeek's multi-head latent attention has narrower values), or DeepSeek-V2/V3's multi-head
// latent attention, whose q, k, v come from LatentProjection's low-rank projections. The attention
// itself is the ContextAttention the context hands it (one rank: LocalAttention; ring or Ulysses
// under context parallelism), and the projections' split and the residual rows' layout come from
// the SequenceLayout it is built with: the code is the one-rank code either way. In bf16 a packed
// projection behind a LayerNorm takes the fused paths: the norm writes the projection's bf16 input,
// the projection writes bf16 q, k, v and their gradient comes back rounded, with the projection's
// bias gradient from the attention backward's own pass. In bf16 q, k, v apart (Llama's) share one
// bf16 input: the norm writes it in bf16 (q_proj's prepared input) and k and v read it too, where
// each would round the fp32 norm output into a copy of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/kernels/rope_table.hpp"
#include "lattice/model/components/latent_projection.hpp"
#include "lattice/model/components/normed_input.hpp"
#include "lattice/model/kv_cache.hpp"
#include "lattice/model/local_attention.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

// What an attention sub-layer is: its names (Hugging Face's, relative to the block's prefix), its
// heads and its options.
struct AttentionDescription {
  std::string norm;  // the pre-norm ("ln_1", "input_layernorm")
  NormKind norm_kind = NormKind::layer_norm;
  std::string packed;   // one q | k | v projection ("attn.c_attn"), or empty ...
  std::string q, k, v;  // ... q, k, v apart ("self_attn.q_proj", ...)
  std::string out;      // the output projection ("attn.c_proj", "self_attn.o_proj")
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // the whole model's
  // The width of a value head (and of the attention's output per head): 0 for head_dim, or its
  // own (q, k, v apart only; RoPE and the q/k norm act on the head_dim-wide q and k).
  int64_t v_head_dim = 0;
  bool input_bias = false;     // q, k, v projections with a bias (GPT-2; Qwen 2.5)
  bool output_bias = false;    // the output projection with a bias (GPT-2)
  bool rope = false;           // rotary positions on q and k (the Transformer's table)
  int64_t sliding_window = 0;  // each query sees itself and the window - 1 keys before (0: all)
  // A per-head RMSNorm of q and of k over head_dim, before RoPE (Qwen 3's "self_attn.q_norm",
  // "self_attn.k_norm"), or none (empty). q, k, v apart only.
  std::string q_norm, k_norm;
  // DeepSeek's multi-head latent attention (enabled(): kv_lora_rank > 0): q, k, v from its latent
  // projections, with head_dim = qk_head_dim(), kv_heads = heads, v_head_dim its values' width;
  // `q` names q_proj when it has no query rank; rope on its qk_rope_head_dim channels only (the
  // table is that wide); no input bias. Under tp its heads are split over the ranks.
  LatentAttentionDescription latent;
};

// What its forward saves (rows = B·T; A = heads · head_dim and kv = kv_heads · head_dim on this
// rank, O = heads · v_head_dim and V = kv_heads · v_head_dim (A and kv when the value heads are
// head_dim wide); local = the layout's own rows).
struct AttentionActivations {
  NormActivations norm;  // the pre-norm's output and statistics ([local, C])
  Tensor qkv;            // packed: [rows, A + 2kv] fp32 q | k | v (fp32 training, cached inference)
  Tensor qkv16;          // packed: [rows, A + 2kv] bf16 (fused bf16 training; qkv not kept)
  Tensor q, k, v;        // apart: [rows, A], [rows, kv], [rows, V] fp32, q and k after RoPE
  Tensor q_raw, k_raw;   // behind a q/k norm: the projections' q and k, before it
  LatentActivations latent;        // multi-head latent attention's projections
  NormActivations q_norm, k_norm;  // the q/k norm's statistics ([rows · heads], [rows · kv_heads])
  Tensor att, lse;                 // [rows, O], [B, heads, T]: dropped by selective checkpointing
  std::vector<LinearActivations> input;  // the input projections' (one packed, or q, k, v)
  LinearActivations output;
  // Between backward_input and backward_weight: the input projections' output gradients (packed:
  // [0] only; fused bf16: rounded, in the first half of its floats) and the output projection's
  // (over all rows).
  std::vector<Tensor> d_input;
  Tensor d_out;
  void release();
};

class Attention {
 public:
  Attention() = default;
  // Declares its parameters under `prefix` + the description's names, split as `input_split` and
  // `output_split` say (the layout's group), in the order of Hugging Face's modules.
  Attention(ParameterStore& store, const std::string& prefix, const AttentionDescription& d,
            int64_t d_model, float norm_eps, const parallel::SequenceLayout& layout,
            parallel::TensorSplit input_split, parallel::TensorSplit output_split,
            const kernels::RopeTable* rope);

  // This rank's heads.
  int64_t heads() const { return heads_; }
  // Whether `precision` takes the fused bf16 paths (a packed projection behind a LayerNorm).
  bool fused(kernels::Precision precision) const {
    return precision == kernels::Precision::bf16 && fusable_;
  }
  // Whether q, k, v apart read one bf16 input the norm writes (bf16 precision; Linear's
  // forward_shared_rows), the fp32 norm output never stored.
  bool shares_input(kernels::Precision precision) const {
    return precision == kernels::Precision::bf16 && !packed();
  }
  // Either: the norm writes the input projections' bf16 input directly.
  bool bf16_input(kernels::Precision precision) const {
    return fused(precision) || shares_input(precision);
  }

  // Sizes the saved tensors for B·T rows (`cached`: for forward_cached, whose q, k, v go to the KV
  // cache in fp32 whatever the precision).
  void prepare(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T,
               bool cached) const;
  // x_out = x + attention(norm(x)) on the layout's own rows of B sequences of T tokens. `partial`:
  // the output projection's partial sums over all rows on a sharded layout (allocated here, kept
  // by the caller for the next sub-layer).
  void forward(const LayerContext& ctx, AttentionActivations& a, float* x_out, const float* x,
               int64_t B, int64_t T, Tensor& partial);
  // Incremental inference: the same for n new tokens of each sequence at positions
  // [cache.length(), cache.length() + n), their keys and values written into the cache's layer.
  void forward_cached(const LayerContext& ctx, AttentionActivations& a, float* x_out,
                      const float* x, int64_t B, int64_t n, KvCache& cache, int64_t cache_layer,
                      Tensor& partial);
  // Selective checkpointing: recomputes the attention output and log-sum-exp a forward dropped.
  void recompute(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T);

  // Where the block puts the gradient at this sub-layer's output (the residual gradient between
  // the sub-layers, [local, C]): on a whole layout it is also the output projection's d_out, kept
  // for a deferred weight half.
  float* output_gradient_buffer(const SublayerBackward& g, AttentionActivations& a) const;
  // d_x = ∂loss/∂x given d_x_out (this rank's rows; d_x may alias d_x_out only when not deferred),
  // the input projections run as `g` says; gradients accumulate.
  void backward(const LayerContext& ctx, AttentionActivations& a, const SublayerBackward& g,
                float* d_x, const float* d_x_out, const float* x);
  // The deferred weight halves (backward_weight), from the output gradients backward kept;
  // `gathered` ([rows, C] fp32, sharded unfused layouts) for the norm output gathered again.
  void weight_pass(const LayerContext& ctx, AttentionActivations& a, int64_t rows, float* gathered);

  // The activation-memory terms (see Block).
  int64_t saved_bytes(kernels::Precision precision, int64_t B, int64_t T) const;
  int64_t attention_output_bytes(int64_t B, int64_t T) const;
  int64_t scratch_floats(int64_t rows) const;  // its own slots (the shared ones: the block's)
  int64_t pending_weight_floats(int64_t rows) const;
  int64_t entry_transient_bytes(kernels::Precision precision, int64_t rows) const;
  bool uses_projection_gradient() const { return !packed(); }
  bool regathers_fp32(kernels::Precision precision) const {
    return !fused(precision) && !shares_input(precision);
  }
  int64_t norm_partial_floats() const {
    return (norm_.kind() == NormKind::layer_norm ? 2 : 1) * C_;
  }

 private:
  bool packed() const { return input_.size() == 1; }
  bool latent() const { return latent_.enabled(); }
  // The projection whose bf16 input the norm writes (bf16_input precisions; null otherwise) and
  // its saved state.
  Linear* bf16_reader(kernels::Precision precision);
  LinearActivations* reader_saved(AttentionActivations& a) const;
  // The attention call's shape for B sequences of T tokens (q, k, v in the packed buffer or apart).
  kernels::AttentionShape shape(int64_t B, int64_t T) const;
  // The attention this context computes with (its context-parallel one, or this rank's own).
  ContextAttention& core(const LayerContext& ctx) { return ctx.context ? *ctx.context : local_; }
  // The input projections' forward over all rows from the normed rows.
  void project(const LayerContext& ctx, AttentionActivations& a, NormedRows& in, int64_t rows,
               bool cached);
  // The attention core on the saved q, k, v into att and lse.
  void attend(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T);
  // The output projection with its reduction onto the layout's rows, then the residual.
  void project_out(const LayerContext& ctx, AttentionActivations& a, float* x_out, const float* x,
                   int64_t rows, Tensor& partial);
  // The fp32 output of input projection i ([rows, out_features]).
  float* projection_output(AttentionActivations& a, size_t i) const;
  // The shared bf16 input of q, k, v over all rows (q_proj's prepared input; checked).
  const lattice::bf16* shared_input(const AttentionActivations& a) const;
  // Behind a q/k norm: q and k normalized per head from the projections' raw q and k.
  void normalize_q_and_k(const LayerContext& ctx, AttentionActivations& a, int64_t rows) const;

  parallel::SequenceLayout layout_;
  const kernels::RopeTable* rope_ = nullptr;
  Norm norm_;
  std::vector<Linear> input_;  // one packed, or q, k, v
  Linear output_;
  LocalAttention local_;
  // C: the model width; on this rank heads_ query and kv_heads_ key/value heads of head_dim_,
  // A_ = heads_ · head_dim_ and KV_ = kv_heads_ · head_dim_ channels of q and k; values of
  // v_head_dim_: V_ = kv_heads_ · v_head_dim_ channels of v, O_ = heads_ · v_head_dim_ of the
  // attention output (V_ = KV_ and O_ = A_ when v_head_dim_ = head_dim_).
  int64_t C_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, A_ = 0, KV_ = 0;
  int64_t v_head_dim_ = 0, V_ = 0, O_ = 0;
  int64_t window_ = 0;  // the sliding window (AttentionShape::window)
  bool qk_norm_ = false;
  Norm q_norm_, k_norm_;  // per head, over head_dim
  bool fusable_ = false;
  LatentProjection latent_;  // multi-head latent attention's q, k, v (input_ then empty)
};

}  // namespace lattice::model
