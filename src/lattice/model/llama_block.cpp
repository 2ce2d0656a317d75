// Llama transformer block: see llama_block.hpp.
#include "lattice/model/llama_block.hpp"

#include <initializer_list>

#include "lattice/core/error.hpp"
#include "lattice/model/kv_cache.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

LlamaBlock::LlamaBlock(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
                       const TensorParallelGroup& tp, const k::RopeTable& rope)
    : store_(store),
      rope_(rope),
      tp_(tp),
      C_(config.d_model),
      heads_(config.n_heads / tp.size),
      kv_heads_(config.n_kv_heads / tp.size),
      head_dim_(config.head_dim()),
      eps_(config.norm_eps) {
  check(config.n_heads % tp.size == 0 && config.n_kv_heads % tp.size == 0 &&
            config.ffn_hidden % tp.size == 0,
        "parallelism.tp = " + std::to_string(tp.size) + " must divide the " +
            std::to_string(config.n_heads) + " attention heads, the " +
            std::to_string(config.n_kv_heads) + " key/value heads and the MLP width " +
            std::to_string(config.ffn_hidden) + ": pick a tp that divides all three");
  A_ = heads_ * head_dim_;
  const std::string p = "model.layers." + std::to_string(layer_index) + ".";
  const int64_t kv = config.n_kv_heads * head_dim_, F = config.ffn_hidden;
  constexpr TensorSplit column = TensorSplit::column, row = TensorSplit::row;
  // q, k, v column-parallel by heads (grouped-query attention splits the key/value heads too),
  // o_proj row-parallel; gate and up column-parallel, down row-parallel.
  norm1_weight_ = store.declare(p + "input_layernorm.weight", {C_}, InitKind::ones, false);
  q_proj_ = Linear(store, p + "self_attn.q_proj", C_, C_, false, InitKind::normal, tp, column);
  k_proj_ = Linear(store, p + "self_attn.k_proj", C_, kv, false, InitKind::normal, tp, column);
  v_proj_ = Linear(store, p + "self_attn.v_proj", C_, kv, false, InitKind::normal, tp, column);
  o_proj_ =
      Linear(store, p + "self_attn.o_proj", C_, C_, false, InitKind::normal_residual, tp, row);
  norm2_weight_ = store.declare(p + "post_attention_layernorm.weight", {C_}, InitKind::ones, false);
  gate_proj_ = Linear(store, p + "mlp.gate_proj", C_, F, false, InitKind::normal, tp, column);
  up_proj_ = Linear(store, p + "mlp.up_proj", C_, F, false, InitKind::normal, tp, column);
  down_proj_ = Linear(store, p + "mlp.down_proj", F, C_, false, InitKind::normal_residual, tp, row);
  F_ = gate_proj_.out_features();
}

void LlamaBlockActivations::release() {
  for (Tensor* t : {&n1,   &rstd1, &q, &k,   &v,   &att, &lse,  &x2,     &n2,   &rstd2,
                    &gate, &up,    &h, &d_q, &d_k, &d_v, &d_x2, &d_gate, &d_up, &d_y})
    t->reset();
  for (LinearActivations* l :
       {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj})
    l->release();
  weight_gradients_pending = false;
}

std::unique_ptr<BlockActivations> LlamaBlock::make_activations() const {
  return std::make_unique<Saved>();
}

int64_t LlamaBlock::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // prepare_activations' fp32 tensors (n1, q, k, v, x2, n2, gate, up, h, the two rstd; att and
  // lse below) and, in bf16, each Linear's kept bf16 input: n1 for q/k/v, att for o, n2 for
  // gate/up, h for down.
  const int64_t rows = B * T, C = C_, F = F_, kv = kv_heads_ * head_dim_;
  int64_t bytes = rows * 4 * (C + A_ + 2 * kv + C + C + 3 * F + 2) + attention_output_bytes(B, T);
  if (precision == k::Precision::bf16) bytes += rows * 2 * (3 * C + A_ + 2 * C + F);
  return bytes;
}

int64_t LlamaBlock::attention_output_bytes(int64_t B, int64_t T) const {
  return B * T * A_ * 4 + B * heads_ * T * 4;  // att [rows, A] and lse [B, Hq, T], fp32
}

int64_t LlamaBlock::scratch_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // backward_pass's scratch slots: d_h, d_gate, d_up [rows, F]; d_norm, d_part, d_x2, d_att, d_q
  // [rows, C]; d_k, d_v [rows, kv].
  (void)precision;
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  return 4 * rows * (3 * F_ + 3 * C_ + 2 * A_ + 2 * kv);
}

void LlamaBlock::prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  ensure_activation(a.n1, {rows, C_}, tr);
  ensure_activation(a.rstd1, {rows}, tr);
  ensure_activation(a.q, {rows, A_}, tr);
  ensure_activation(a.k, {rows, kv}, tr);
  ensure_activation(a.v, {rows, kv}, tr);
  ensure_activation(a.att, {rows, A_}, tr);
  ensure_activation(a.lse, {B, heads_, T}, tr);
  ensure_activation(a.x2, {rows, C_}, tr);
  ensure_activation(a.n2, {rows, C_}, tr);
  ensure_activation(a.rstd2, {rows}, tr);
  ensure_activation(a.gate, {rows, F_}, tr);
  ensure_activation(a.up, {rows, F_}, tr);
  ensure_activation(a.h, {rows, F_}, tr);
}

void LlamaBlock::qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows) {
  ctx.ops.rmsnorm_forward(a.n1.f32(), a.rstd1.f32(), x_in, store_.value(norm1_weight_), rows, C_,
                          eps_);
  q_proj_.forward(ctx, a.q_proj, a.q.f32(), a.n1.f32(), rows);
  k_proj_.forward(ctx, a.k_proj, a.k.f32(), a.n1.f32(), rows);
  v_proj_.forward(ctx, a.v_proj, a.v.f32(), a.n1.f32(), rows);
}

void LlamaBlock::attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), a.q.f32(), a.k.f32(), a.v.f32(), shape,
                            ctx.precision, {});
}

void LlamaBlock::projection_and_mlp_forward(const LayerContext& ctx, Saved& a, float* x_out,
                                            const float* x_in, int64_t rows) {
  o_proj_.forward(ctx, a.o_proj, a.x2.f32(), a.att.f32(), rows);
  all_reduce_over_tp(tp_, a.x2.f32(), rows * C_);  // the row-parallel projection's partial sums
  ctx.ops.add_inplace(a.x2.f32(), x_in, rows * C_);
  ctx.ops.rmsnorm_forward(a.n2.f32(), a.rstd2.f32(), a.x2.f32(), store_.value(norm2_weight_), rows,
                          C_, eps_);
  gate_proj_.forward(ctx, a.gate_proj, a.gate.f32(), a.n2.f32(), rows);
  up_proj_.forward(ctx, a.up_proj, a.up.f32(), a.n2.f32(), rows);
  ctx.ops.swiglu_forward(a.h.f32(), a.gate.f32(), a.up.f32(), rows * F_);
  down_proj_.forward(ctx, a.down_proj, x_out, a.h.f32(), rows);
  all_reduce_over_tp(tp_, x_out, rows * C_);
  ctx.ops.add_inplace(x_out, a.x2.f32(), rows * C_);
}

void LlamaBlock::forward(const LayerContext& ctx, BlockActivations& saved, float* x_out,
                         const float* x_in, int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  prepare_activations(ctx, a, B, T);
  qkv_forward(ctx, a, x_in, rows);
  ctx.ops.rope(rope_, a.q.f32(), B, T, heads_, A_, T * A_, 0, false);
  ctx.ops.rope(rope_, a.k.f32(), B, T, kv_heads_, kv, T * kv, 0, false);
  attention_core(ctx, a, B, T);
  projection_and_mlp_forward(ctx, a, x_out, x_in, rows);
  drop_recomputed_attention(a, a.att, a.lse);  // selective checkpointing: recomputed in backward
}

void LlamaBlock::backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                               const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                               BackwardScratch& scratch, bool defer) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  if (a.recompute_attention && a.att.empty()) {  // selective checkpointing: the attention again
    ensure_activation(a.att, {rows, A_}, tr);
    ensure_activation(a.lse, {B, heads_, T}, tr);
    attention_core(ctx, a, B, T);
    // o_proj's bf16 input was rounded from these same values: it stays valid.
    if (a.o_proj.rounded_from != nullptr) a.o_proj.rounded_from = a.att.f32();
  }
  // The gradients each Linear's weight half reads: scratch when it runs here, kept in `a` when
  // backward_weight runs it later.
  auto kept = [&](Tensor& pending, int slot, int64_t numel) {
    return weight_gradient_operand(defer, pending, scratch, slot, numel, tr);
  };
  float* d_h = scratch.get(0, rows * F_, tr);
  float* d_gate = kept(a.d_gate, 1, rows * F_);
  float* d_up = kept(a.d_up, 2, rows * F_);
  float* d_norm = scratch.get(3, rows * C_, tr);
  float* d_part = scratch.get(4, rows * C_, tr);
  float* d_x2 = kept(a.d_x2, 5, rows * C_);
  float* d_att = scratch.get(6, rows * A_, tr);
  float* d_q = kept(a.d_q, 7, rows * A_);
  float* d_k = kept(a.d_k, 8, rows * kv);
  float* d_v = kept(a.d_v, 9, rows * kv);
  // A Linear's backward: both halves now, or the input half with the weight half left for later.
  auto linear_backward = [&](Linear& layer, LinearActivations& saved, float* d_in,
                             const float* d_out, const float* in) {
    if (defer)
      layer.backward_input(ctx, saved, d_in, d_out, rows);
    else
      layer.backward(ctx, saved, d_in, d_out, in, rows);
  };
  // Tensor parallelism: the column-parallel layers' summed input gradient is all-reduced over tp
  // while their weight gradients are computed (input halves, the reduction started, weight
  // halves, the wait); without overlap (or when the weight halves are deferred) it blocks.
  const bool overlap = tp_.size > 1 && tp_.overlap && !defer;
  auto column_input_half = [&](Linear& layer, LinearActivations& saved, float* d_in,
                               const float* d_out, const float* in) {
    if (overlap)
      layer.backward_input(ctx, saved, d_in, d_out, rows);
    else
      linear_backward(layer, saved, d_in, d_out, in);
  };
  struct WeightHalf {
    Linear* layer;
    LinearActivations* saved;
    const float* d_out;
    const float* in;
  };
  auto reduce_input_gradient = [&](float* d_in, std::initializer_list<WeightHalf> weight_halves) {
    if (!overlap) {
      all_reduce_over_tp(tp_, d_in, rows * C_);
      return;
    }
    TpReduction reduction(tp_, d_in, rows * C_);
    for (const WeightHalf& w : weight_halves)
      w.layer->backward_weight(ctx, *w.saved, w.d_out, w.in, rows);
    reduction.wait();
  };

  // MLP branch: x_out = x2 + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(x2).
  if (defer)  // d_x_out may be overwritten by d_x_in below: down_proj's W keeps its own copy
    ctx.ops.copy(kept(a.d_y, 0, rows * C_), d_x_out, rows * C_);
  linear_backward(down_proj_, a.down_proj, d_h, d_x_out, a.h.f32());
  ctx.ops.swiglu_backward(d_gate, d_up, d_h, a.gate.f32(), a.up.f32(), rows * F_);
  column_input_half(gate_proj_, a.gate_proj, d_norm, d_gate, a.n2.f32());
  column_input_half(up_proj_, a.up_proj, d_part, d_up, a.n2.f32());
  ctx.ops.add_inplace(d_norm, d_part, rows * C_);
  reduce_input_gradient(
      d_norm,  // the column-parallel layers' partial gradients
      {{&gate_proj_, &a.gate_proj, d_gate, a.n2.f32()}, {&up_proj_, &a.up_proj, d_up, a.n2.f32()}});
  ctx.ops.rmsnorm_backward(d_x2, store_.grad(norm2_weight_), d_norm, a.x2.f32(),
                           store_.value(norm2_weight_), a.rstd2.f32(), rows, C_,
                           /*residual_grad=*/d_x_out);

  // Attention branch: x2 = x_in + o(attention(rope(q(n1)), rope(k(n1)), v(n1))).
  linear_backward(o_proj_, a.o_proj, d_att, d_x2, a.att.f32());
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  ctx.ops.attention_backward(d_q, d_k, d_v, d_att, a.q.f32(), a.k.f32(), a.v.f32(), a.att.f32(),
                             a.lse.f32(), shape, ctx.precision, {});
  ctx.ops.rope(rope_, d_q, B, T, heads_, A_, T * A_, 0, true);
  ctx.ops.rope(rope_, d_k, B, T, kv_heads_, kv, T * kv, 0, true);
  column_input_half(q_proj_, a.q_proj, d_norm, d_q, a.n1.f32());
  column_input_half(k_proj_, a.k_proj, d_part, d_k, a.n1.f32());
  ctx.ops.add_inplace(d_norm, d_part, rows * C_);
  column_input_half(v_proj_, a.v_proj, d_part, d_v, a.n1.f32());
  ctx.ops.add_inplace(d_norm, d_part, rows * C_);
  reduce_input_gradient(d_norm, {{&q_proj_, &a.q_proj, d_q, a.n1.f32()},
                                 {&k_proj_, &a.k_proj, d_k, a.n1.f32()},
                                 {&v_proj_, &a.v_proj, d_v, a.n1.f32()}});
  ctx.ops.rmsnorm_backward(d_x_in, store_.grad(norm1_weight_), d_norm, x_in,
                           store_.value(norm1_weight_), a.rstd1.f32(), rows, C_,
                           /*residual_grad=*/d_x2);
  if (!defer) drop_recomputed_attention(a, a.att, a.lse);
}

void LlamaBlock::weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                             int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T;
  down_proj_.backward_weight(ctx, a.down_proj, a.d_y.f32(), a.h.f32(), rows);
  gate_proj_.backward_weight(ctx, a.gate_proj, a.d_gate.f32(), a.n2.f32(), rows);
  up_proj_.backward_weight(ctx, a.up_proj, a.d_up.f32(), a.n2.f32(), rows);
  o_proj_.backward_weight(ctx, a.o_proj, a.d_x2.f32(), a.att.f32(), rows);
  q_proj_.backward_weight(ctx, a.q_proj, a.d_q.f32(), a.n1.f32(), rows);
  k_proj_.backward_weight(ctx, a.k_proj, a.d_k.f32(), a.n1.f32(), rows);
  v_proj_.backward_weight(ctx, a.v_proj, a.d_v.f32(), a.n1.f32(), rows);
  for (Tensor* t : {&a.d_q, &a.d_k, &a.d_v, &a.d_x2, &a.d_gate, &a.d_up, &a.d_y}) t->reset();
  drop_recomputed_attention(a, a.att, a.lse);
}

void LlamaBlock::forward_cached(const LayerContext& ctx, BlockActivations& work, float* x_out,
                                const float* x_in, int64_t B, int64_t n, KvCache& cache,
                                int64_t cache_layer) {
  Saved& a = saved_as<Saved>(work);
  check(tp_.size == 1,
        "KV-cached generation runs on one rank: generate from the run's (logical) checkpoint");
  const int64_t rows = B * n, kv = kv_heads_ * head_dim_, start = cache.length();
  prepare_activations(ctx, a, B, n);
  qkv_forward(ctx, a, x_in, rows);
  // RoPE at the absolute positions [start, start + n); cached keys are stored rotated.
  ctx.ops.rope(rope_, a.q.f32(), B, n, heads_, A_, n * A_, start, false);
  ctx.ops.rope(rope_, a.k.f32(), B, n, kv_heads_, kv, n * kv, start, false);
  cache.write(cache_layer, a.k.f32(), a.v.f32(), kv, n);
  k::AttentionShape shape = k::AttentionShape::contiguous(B, n, heads_, kv_heads_, head_dim_);
  shape.kv_len = start + n;
  shape.k_row_stride = shape.v_row_stride = cache.row_stride();
  shape.kv_batch_stride = cache.batch_stride();
  ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), a.q.f32(), cache.keys(cache_layer),
                            cache.values(cache_layer), shape, ctx.precision, {});
  projection_and_mlp_forward(ctx, a, x_out, x_in, rows);
}

}  // namespace lattice::model
