// The slots of the blocks' shared backward scratch (BackwardScratch), by role. One block runs
// backward at a time, and within a block the attention and the MLP sub-layers run one after the
// other, so the roles both have (the norm's gradient, the summed input gradient ...) share a slot
// across sub-layers and blocks.
#pragma once

namespace lattice::model::slot {

// Shared by both sub-layers.
constexpr int norm_gradient = 0;         // [local, C] ∂loss/∂ the norm's output
constexpr int residual_gradient = 1;     // [local, C] between the sub-layers (sharded layouts)
constexpr int input_gradient_rows = 2;   // [rows, C] the input projections' summed input gradient
constexpr int projection_gradient = 3;   // [rows, C] one input projection's, before it is added
constexpr int regathered_input = 4;      // [rows, C] a norm output gathered again (fp32)
constexpr int norm_partials = 5;         // [2C] a norm's weight gradients from this rank's rows
constexpr int output_gradient_rows = 6;  // [rows, C] an output projection's d_out, gathered
// Attention.
constexpr int attention_output_gradient = 7;  // [rows, A]
constexpr int qkv_gradient = 8;               // packed [rows, 3A]; apart: q here, k and v next
constexpr int normed_q_gradient = 15;         // [rows, A] behind a q/k norm: ∂loss/∂ normed q
constexpr int normed_k_gradient = 16;         // [rows, kv] and k
constexpr int qk_norm_partials = 17;          // [head_dim] tp > 1: a q/k norm's partial gradient
// Multi-head latent attention (LatentProjection; qkv_gradient holds q_proj's or q_a_proj's d_out,
// the two after it d k and d v).
constexpr int latent_q_gradient = 18;           // [rows, heads·qk] d q with a query rank
constexpr int latent_kv_a_gradient = 19;        // [rows, kv_rank + rope] kv_a_proj's d_out
constexpr int latent_kv_b_gradient = 20;        // [rows, heads·(nope + v)] kv_b_proj's d_out
constexpr int latent_normed_gradient = 21;      // [rows, rank] a latent norm's d_out
constexpr int latent_compressed_gradient = 22;  // [rows, kv_rank] d c, the latent norm's d_in
constexpr int latent_rope_gradient = 23;        // [rows, rope] d k_pe summed over the heads
constexpr int latent_rope_head_gradient = 24;   // [rows, rope] one head's d k_pe
constexpr int latent_norm_partials = 25;        // [rank] tp > 1: a latent norm's partial gradient
// MLPs.
constexpr int mlp_hidden_gradient = 11;  // [rows, F] (GELU: d_gelu, or bf16 c_proj's d_out)
constexpr int mlp_input_gradient = 12;   // [rows, F] c_fc's / gate's d_out; up's next
constexpr int routed_gradient = 14;      // [rows, C] a MoE layer's routed experts' input gradient

}  // namespace lattice::model::slot
