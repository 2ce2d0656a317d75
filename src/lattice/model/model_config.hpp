// Model configuration: the architecture family (GPT-2, Llama, Mistral, Qwen 2, Qwen 3 or
// DeepSeek-V3), its
// dimensions, the named presets and the checks that refuse a model whose dimensions do not fit
// together. This is the one model description of Lattice: the trainer builds it, the planner
// (`lattice estimate/simulate/plan`) estimates it, and both read the same preset table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lattice/kernels/moe_routing.hpp"
#include "lattice/kernels/rope_scaling.hpp"
#include "lattice/kernels/vocab_range.hpp"

namespace lattice::model {

// gpt2: learned positions, LayerNorm with bias, biased projections, GELU MLP (2 matrices).
// llama: RoPE, RMSNorm, no biases, SwiGLU MLP (3 matrices).
// qwen2: Llama's block with biases on the q, k and v projections (Qwen 2 and 2.5).
// qwen3: Llama's block with a per-head RMSNorm of q and of k before RoPE (Qwen 3), no biases.
// mistral: Llama's block, saved as Hugging Face's MistralForCausalLM (its sliding window; any RoPE
// family honours model.sliding_window, Mistral is the one whose Hugging Face type carries it).
// deepseek: Llama's block with DeepSeek-V2/V3's multi-head latent attention when kv_lora_rank > 0
// (Hugging Face's DeepseekV3 names) and DeepSeek-style MoE layers after the first dense ones.
enum class Family { gpt2, llama, qwen2, qwen3, mistral, deepseek };

// How a MoE layer's parameters are named (Hugging Face): mixtral —
// "block_sparse_moe.gate.weight", "block_sparse_moe.experts.<j>.w1/w3/w2.weight"; deepseek (also
// Qwen2/3-MoE's) — "mlp.gate.weight", "mlp.experts.<j>.gate_proj/up_proj/down_proj.weight",
// "mlp.shared_experts.gate_proj/up_proj/down_proj.weight".
enum class MoeNames { mixtral, deepseek };

// A routed expert's MLP: SwiGLU (Mixtral, DeepSeek, Qwen: gate, up, down) or GELU in its tanh form
// (Switch/GShard-style: in, GELU, out; names w1 / w2, or up_proj / down_proj).
enum class MoeActivation { swiglu, gelu };

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int64_t vocab_size = 256;
  int64_t max_seq_len = 256;  // learned positions (GPT-2) / RoPE table length (Llama)
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;  // grouped-query attention: n_heads must be a multiple of it
  // A head's width when it is not d_model / n_heads (Qwen 3: 128 at any width); 0: d_model /
  // n_heads. The q and o projections are then n_heads · head_dim wide.
  int64_t explicit_head_dim = 0;
  // Each query sees itself and the sliding_window - 1 positions before it (Mistral); 0: every
  // earlier position. RoPE families only.
  int64_t sliding_window = 0;
  int64_t ffn_hidden = 512;  // GPT-2: 4·d_model; Llama: SwiGLU inner size (per expert for MoE)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // RoPE scaling (context extension: linear, dynamic, llama3, yarn; kernels/rope_scaling.hpp).
  kernels::RopeScaling rope_scaling;
  bool tied_embeddings = true;  // GPT-2 ties the head to the token embedding
  float init_std = 0.02f;
  // Mixture of experts (Llama family; docs/moe.md): routed experts per MoE layer (1 = dense) and
  // experts each token is routed to.
  int64_t n_experts = 1;
  int64_t top_k = 1;
  // Layer i is a MoE layer when (i + 1) % moe_layer_interval == 0 (Hugging Face's
  // decoder_sparse_step: 1 = every layer, 2 = every second one); the others keep a dense MLP of
  // ffn_hidden.
  int64_t moe_layer_interval = 1;
  // Layers below this keep a dense MLP of ffn_hidden whatever the interval (DeepSeek's
  // first_k_dense_replace; 0: none).
  int64_t moe_first_dense_layers = 0;
  int64_t moe_ffn_hidden = 0;      // each routed expert's SwiGLU width (0: ffn_hidden)
  int64_t moe_shared_experts = 0;  // always-on experts (DeepSeek): one SwiGLU of this many widths
  kernels::RouterScore moe_score = kernels::RouterScore::softmax;
  bool moe_normalize = true;  // renormalise the chosen scores to sum to 1
  float moe_scaling = 1.0f;   // every routed weight times this (DeepSeek-V3: 2.5)
  // Unset: dropless; else each expert keeps ceil(factor·T·k/E) copies of a micro-batch's T
  // tokens (must be > 0).
  std::optional<double> moe_capacity_factor;
  double moe_aux_loss_coef = 0;  // the Switch/GShard load-balancing loss's coefficient
  double moe_z_loss_coef = 0;    // the router z-loss's coefficient (ST-MoE)
  // Auxiliary-loss-free balancing (DeepSeek-V3): each MoE layer keeps a per-expert bias that is
  // added to the scores for the top-k choice only (parameter "<gate>.e_score_correction_bias",
  // never trained by the gradient); after every step each expert's bias moves by this rate
  // towards balance: + rate where the expert got fewer copies than the mean over the step's
  // global batch, - rate where more. 0: no bias.
  double moe_bias_update_rate = 0;
  // Keeps the choice bias even at update rate 0, held as it is (an imported DeepSeek-V3's
  // trained e_score_correction_bias); a rate > 0 implies it.
  bool moe_choice_bias = false;
  bool has_choice_bias() const { return moe_choice_bias || moe_bias_update_rate > 0; }
  // Group-limited routing (DeepSeek-V3's n_group / topk_group; 1 / 1: every expert competes):
  // the experts form moe_groups equal groups, each scored by the sum of its two best choice
  // scores (score + bias), and a token picks its top_k experts within its moe_top_groups best.
  int64_t moe_groups = 1;
  int64_t moe_top_groups = 1;
  MoeNames moe_names = MoeNames::mixtral;
  MoeActivation moe_activation = MoeActivation::swiglu;
  int64_t expert_matrices() const { return moe_activation == MoeActivation::gelu ? 2 : 3; }
  // Dropout probability after the embedding, the attention output and the MLP output (Megatron's
  // recipe, 0.1 in the published GPT tables). The planner counts the masks it stores; the trainer
  // has no dropout yet and refuses a nonzero value.
  float dropout = 0.0f;
  // Multi-head latent attention (DeepSeek-V2/V3, family deepseek; all 0: none): the query's
  // low-rank width (0: one q_proj), the compressed key/value width (> 0 turns MLA on), each
  // query/key head's channels without and with RoPE, and each value head's width.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  bool latent_attention() const { return kv_lora_rank > 0; }
  // A query/key head's width: explicit, qk_nope + qk_rope under latent attention, else
  // d_model / n_heads.
  int64_t head_dim() const {
    if (explicit_head_dim > 0) return explicit_head_dim;
    return latent_attention() ? qk_nope_head_dim + qk_rope_head_dim : d_model / n_heads;
  }
  // The channels RoPE rotates per head (the RopeTable's width) and a value head's width.
  int64_t rope_head_dim() const { return latent_attention() ? qk_rope_head_dim : head_dim(); }
  int64_t value_head_dim() const { return latent_attention() ? v_head_dim : head_dim(); }
  // The query heads' channels, n_heads · head_dim (d_model unless the head width is explicit).
  int64_t attention_width() const { return n_heads * head_dim(); }
  // The keys one query attends to at sequence length T, as the FLOP count takes them (every
  // position, or the sliding window).
  int64_t attended_keys(int64_t seq_len) const {
    return sliding_window > 0 ? std::min(seq_len, sliding_window) : seq_len;
  }
  // The vocabulary a tensor-parallel group of `tp` ranks splits: vocab_size itself at tp = 1,
  // else padded to a multiple of tp x 64 (Megatron's make-vocab-size-divisible-by), so that every
  // rank holds an equal slice; the padded rows are never looked up and their logits never count.
  int64_t padded_vocab_size(int tp) const {
    const int64_t multiple = int64_t{64} * tp;
    return tp == 1 ? vocab_size : (vocab_size + multiple - 1) / multiple * multiple;
  }
  // The real vocabulary rows [begin, end) of tp rank `rank`'s slice of the padded vocabulary (empty
  // where the slice is all padding; the whole vocabulary at tp = 1).
  kernels::VocabRange vocab_slice(int rank, int tp) const {
    const int64_t rows = padded_vocab_size(tp) / tp;
    return {std::min(vocab_size, rank * rows), std::min(vocab_size, (rank + 1) * rows)};
  }
  bool is_moe() const { return n_experts > 1; }
  // Whether layer `layer` (0-based) holds a MoE MLP.
  bool is_moe_layer(int64_t layer) const {
    return is_moe() && layer >= moe_first_dense_layers && (layer + 1) % moe_layer_interval == 0;
  }
  int64_t moe_layers() const {
    return is_moe() ? n_layers / moe_layer_interval - moe_first_dense_layers / moe_layer_interval
                    : 0;
  }
  int64_t expert_ffn_hidden() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
  bool has_dropout() const { return dropout > 0; }
  // What the family implies for parameter and activation counts.
  bool gated_mlp() const { return family != Family::gpt2; }          // SwiGLU: 3 MLP matrices
  bool learned_positions() const { return family == Family::gpt2; }  // a wpe table
  bool norm_has_bias() const { return family == Family::gpt2; }      // LayerNorm vs RMSNorm
  bool linear_bias() const { return family == Family::gpt2; }        // every projection biased
  bool qkv_bias() const { return family == Family::gpt2 || family == Family::qwen2; }  // q, k, v
  bool qk_norm() const { return family == Family::qwen3; }  // per-head q/k RMSNorm (Qwen 3)
  // One layer's attention parameters (projections and, under latent attention, its latent norms;
  // not the block's pre-norm): the closed form parameter_count and the planner share.
  int64_t attention_parameter_count() const;
  // Multiply-accumulates per token of one layer's attention projections (q, k, v and output, or
  // MLA's five): its forward GEMM FLOPs are twice this.
  int64_t attention_projection_macs() const;
  // Throws lattice::Error naming the first inconsistency and how to fix it.
  void validate() const;
  void validate_latent_attention() const;  // validate()'s MLA refusals
  // Number of parameters (the trainer's closed form, every expert counted);
  // `with_position_embedding=false` leaves out GPT-2's learned positions (the N of the 6N FLOP
  // formula). active_parameter_count: those one token's forward uses (top_k routed experts of
  // each MoE layer; the same as parameter_count for a dense model).
  int64_t parameter_count(bool with_position_embedding = true) const;
  int64_t active_parameter_count(bool with_position_embedding = true) const;
  // Model FLOPs per trained token at sequence length T: 6N + 12·L·T·A (forward + backward, the
  // attention score and value products counted as in PaLM's MFU definition; N the active
  // parameters without positions, A the attention width; under a sliding window W < T the
  // products span W keys, not T).
  double flops_per_token(int64_t seq_len) const;
};

std::string family_name(Family family);
Family parse_family(const std::string& name);
std::string moe_names_name(MoeNames names);
MoeNames parse_moe_names(const std::string& name);
std::string router_score_name(kernels::RouterScore score);
std::string moe_activation_name(MoeActivation activation);
MoeActivation parse_moe_activation(const std::string& name);
kernels::RouterScore parse_router_score(const std::string& name);

// A GPT-2-family model (learned positions, tied embeddings, 4·d MLP), a Llama-family model
// (untied head), a Qwen 2 model (Llama's with q/k/v biases, RoPE base 10^6, RMSNorm eps 10^-6,
// the head tied as given), a Qwen 3 model (Qwen 2's defaults, q/k norms for its biases, its own
// head width) and a Mistral model (Llama's with a sliding window; 0: none) from their dimensions.
ModelConfig gpt2_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                        int64_t vocab, int64_t max_seq_len);
ModelConfig llama_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                         int64_t kv_heads, int64_t ffn_hidden, int64_t vocab, int64_t max_seq_len);
ModelConfig qwen2_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                         int64_t kv_heads, int64_t ffn_hidden, int64_t vocab, int64_t max_seq_len,
                         bool tied_embeddings);
ModelConfig qwen3_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t ffn_hidden, int64_t vocab,
                         int64_t max_seq_len, bool tied_embeddings);
ModelConfig mistral_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                           int64_t kv_heads, int64_t ffn_hidden, int64_t vocab, int64_t max_seq_len,
                           int64_t sliding_window);
// A DeepSeek-V3 model: Llama's trunk with multi-head latent attention of the given ranks and head
// widths (as many key/value heads as query heads), RMSNorm eps 1e-6, an untied head; the MoE
// fields are the caller's.
struct LatentDims {
  int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
};
ModelConfig deepseek_config(const std::string& name, int64_t layers, int64_t d_model, int64_t heads,
                            const LatentDims& latent, int64_t ffn_hidden, int64_t vocab,
                            int64_t max_seq_len);

// The presets, in table order: the trainer's small models (gpt2-tiny, gpt2-small-test, gpt2-demo,
// llama-tiny, llama-small-test, qwen2-tiny, qwen3-tiny, mistral-tiny, mixtral-tiny,
// deepseek-moe-tiny, qwen3-moe-tiny, deepseek-v3-tiny, llama-60m, llama-1b), GPT-2 124M-1.5B, GPT-3
// 175B, Llama 2 and 3 (7B-405B), Llama 3.1 8B and 3.2 1B / 3B, Mistral 7B, Qwen 2.5 (0.5B, 7B),
// Qwen 3 8B and 30B-A3B, Mixtral 8x7B, DeepSeek-V3 671B, the Megatron-LM weak-scaling models
// (Narayanan et al. 2021, Table 1) and the Korthikanti et al. (2023, Table 3) models. Throws
// lattice::Error listing the names for an unknown one.
ModelConfig model_preset(const std::string& name);
const std::vector<ModelConfig>& model_presets();
std::vector<std::string> model_preset_names();

}  // namespace lattice::model
