// Llama transformer block: see llama_block.hpp.
#include "lattice/model/llama_block.hpp"

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/rmsnorm.hpp"
#include "lattice/model/kv_cache.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

LlamaBlock::LlamaBlock(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
                       const TensorParallelGroup& tp, const k::RopeTable& rope)
    : store_(store),
      rope_(rope),
      C_(config.d_model),
      F_(config.ffn_hidden),
      heads_(config.n_heads),
      kv_heads_(config.n_kv_heads),
      head_dim_(config.head_dim()),
      eps_(config.norm_eps) {
  check(tp.size == 1, "tensor parallelism is not available yet: set parallelism.tp = 1");
  const std::string p = "model.layers." + std::to_string(layer_index) + ".";
  const int64_t kv = kv_heads_ * head_dim_;
  norm1_weight_ = store.declare(p + "input_layernorm.weight", {C_}, InitKind::ones, false);
  q_proj_ = Linear(store, p + "self_attn.q_proj", C_, C_, false, InitKind::normal);
  k_proj_ = Linear(store, p + "self_attn.k_proj", C_, kv, false, InitKind::normal);
  v_proj_ = Linear(store, p + "self_attn.v_proj", C_, kv, false, InitKind::normal);
  o_proj_ = Linear(store, p + "self_attn.o_proj", C_, C_, false, InitKind::normal_residual);
  norm2_weight_ = store.declare(p + "post_attention_layernorm.weight", {C_}, InitKind::ones, false);
  gate_proj_ = Linear(store, p + "mlp.gate_proj", C_, F_, false, InitKind::normal);
  up_proj_ = Linear(store, p + "mlp.up_proj", C_, F_, false, InitKind::normal);
  down_proj_ = Linear(store, p + "mlp.down_proj", F_, C_, false, InitKind::normal_residual);
}

void LlamaBlock::prepare_activations(const LayerContext& ctx, int64_t B, int64_t T) {
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  ensure_activation(n1_, {rows, C_}, tr);
  ensure_activation(rstd1_, {rows}, tr);
  ensure_activation(q_, {rows, C_}, tr);
  ensure_activation(k_, {rows, kv}, tr);
  ensure_activation(v_, {rows, kv}, tr);
  ensure_activation(att_, {rows, C_}, tr);
  ensure_activation(lse_, {B, heads_, T}, tr);
  ensure_activation(x2_, {rows, C_}, tr);
  ensure_activation(n2_, {rows, C_}, tr);
  ensure_activation(rstd2_, {rows}, tr);
  ensure_activation(gate_, {rows, F_}, tr);
  ensure_activation(up_, {rows, F_}, tr);
  ensure_activation(h_, {rows, F_}, tr);
}

void LlamaBlock::qkv_forward(const LayerContext& ctx, const float* x_in, int64_t rows) {
  k::rmsnorm_forward(n1_.f32(), rstd1_.f32(), x_in, store_.value(norm1_weight_), rows, C_, eps_);
  q_proj_.forward(ctx, q_.f32(), n1_.f32(), rows);
  k_proj_.forward(ctx, k_.f32(), n1_.f32(), rows);
  v_proj_.forward(ctx, v_.f32(), n1_.f32(), rows);
}

void LlamaBlock::projection_and_mlp_forward(const LayerContext& ctx, float* x_out,
                                            const float* x_in, int64_t rows) {
  o_proj_.forward(ctx, x2_.f32(), att_.f32(), rows);
  k::add_inplace(x2_.f32(), x_in, rows * C_);
  k::rmsnorm_forward(n2_.f32(), rstd2_.f32(), x2_.f32(), store_.value(norm2_weight_), rows, C_,
                     eps_);
  gate_proj_.forward(ctx, gate_.f32(), n2_.f32(), rows);
  up_proj_.forward(ctx, up_.f32(), n2_.f32(), rows);
  k::swiglu_forward(h_.f32(), gate_.f32(), up_.f32(), rows * F_);
  down_proj_.forward(ctx, x_out, h_.f32(), rows);
  k::add_inplace(x_out, x2_.f32(), rows * C_);
}

void LlamaBlock::forward(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                         int64_t T) {
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  prepare_activations(ctx, B, T);
  qkv_forward(ctx, x_in, rows);
  rope_.apply(q_.f32(), B, T, heads_, C_, T * C_, 0, false);
  rope_.apply(k_.f32(), B, T, kv_heads_, kv, T * kv, 0, false);
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  k::attention_forward(att_.f32(), lse_.f32(), q_.f32(), k_.f32(), v_.f32(), shape, ctx.precision,
                       ctx.matmul);
  projection_and_mlp_forward(ctx, x_out, x_in, rows);
}

void LlamaBlock::backward(const LayerContext& ctx, float* d_x_in, const float* d_x_out,
                          const float* x_in, int64_t B, int64_t T, BackwardScratch& scratch) {
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  float* d_h = scratch.get(0, rows * F_, tr);
  float* d_gate = scratch.get(1, rows * F_, tr);
  float* d_up = scratch.get(2, rows * F_, tr);
  float* d_norm = scratch.get(3, rows * C_, tr);
  float* d_part = scratch.get(4, rows * C_, tr);
  float* d_x2 = scratch.get(5, rows * C_, tr);
  float* d_att = scratch.get(6, rows * C_, tr);
  float* d_q = scratch.get(7, rows * C_, tr);
  float* d_k = scratch.get(8, rows * kv, tr);
  float* d_v = scratch.get(9, rows * kv, tr);

  // MLP branch: x_out = x2 + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(x2).
  down_proj_.backward(ctx, d_h, d_x_out, h_.f32(), rows);
  k::swiglu_backward(d_gate, d_up, d_h, gate_.f32(), up_.f32(), rows * F_);
  gate_proj_.backward(ctx, d_norm, d_gate, n2_.f32(), rows);
  up_proj_.backward(ctx, d_part, d_up, n2_.f32(), rows);
  k::add_inplace(d_norm, d_part, rows * C_);
  k::rmsnorm_backward(d_x2, store_.grad(norm2_weight_), d_norm, x2_.f32(),
                      store_.value(norm2_weight_), rstd2_.f32(), rows, C_,
                      /*residual_grad=*/d_x_out);

  // Attention branch: x2 = x_in + o(attention(rope(q(n1)), rope(k(n1)), v(n1))).
  o_proj_.backward(ctx, d_att, d_x2, att_.f32(), rows);
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  k::attention_backward(d_q, d_k, d_v, d_att, q_.f32(), k_.f32(), v_.f32(), att_.f32(), lse_.f32(),
                        shape, ctx.precision, ctx.matmul);
  rope_.apply(d_q, B, T, heads_, C_, T * C_, 0, true);
  rope_.apply(d_k, B, T, kv_heads_, kv, T * kv, 0, true);
  q_proj_.backward(ctx, d_norm, d_q, n1_.f32(), rows);
  k_proj_.backward(ctx, d_part, d_k, n1_.f32(), rows);
  k::add_inplace(d_norm, d_part, rows * C_);
  v_proj_.backward(ctx, d_part, d_v, n1_.f32(), rows);
  k::add_inplace(d_norm, d_part, rows * C_);
  k::rmsnorm_backward(d_x_in, store_.grad(norm1_weight_), d_norm, x_in, store_.value(norm1_weight_),
                      rstd1_.f32(), rows, C_, /*residual_grad=*/d_x2);
}

void LlamaBlock::forward_cached(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                                int64_t n, KvCache& cache, int64_t cache_layer) {
  const int64_t rows = B * n, kv = kv_heads_ * head_dim_, start = cache.length();
  prepare_activations(ctx, B, n);
  qkv_forward(ctx, x_in, rows);
  // RoPE at the absolute positions [start, start + n); cached keys are stored rotated.
  rope_.apply(q_.f32(), B, n, heads_, C_, n * C_, start, false);
  rope_.apply(k_.f32(), B, n, kv_heads_, kv, n * kv, start, false);
  cache.write(cache_layer, k_.f32(), v_.f32(), kv, n);
  k::AttentionShape shape = k::AttentionShape::contiguous(B, n, heads_, kv_heads_, head_dim_);
  shape.kv_len = start + n;
  shape.k_row_stride = shape.v_row_stride = cache.row_stride();
  shape.kv_batch_stride = cache.batch_stride();
  k::attention_forward(att_.f32(), lse_.f32(), q_.f32(), cache.keys(cache_layer),
                       cache.values(cache_layer), shape, ctx.precision, ctx.matmul);
  projection_and_mlp_forward(ctx, x_out, x_in, rows);
}

void LlamaBlock::release_activations() {
  for (Tensor* t :
       {&n1_, &rstd1_, &q_, &k_, &v_, &att_, &lse_, &x2_, &n2_, &rstd2_, &gate_, &up_, &h_})
    t->reset();
  for (Linear* l : {&q_proj_, &k_proj_, &v_proj_, &o_proj_, &gate_proj_, &up_proj_, &down_proj_})
    l->release_activations();
}

}  // namespace lattice::model
