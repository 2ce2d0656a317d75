// GPT-2 transformer block: see gpt2_block.hpp.
#include "lattice/model/gpt2_block.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/kv_cache.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

Gpt2Block::Gpt2Block(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
                     const TensorParallelGroup& tp)
    : store_(store),
      tp_(tp),
      C_(config.d_model),
      heads_(config.n_heads / tp.size),
      head_dim_(config.head_dim()),
      eps_(config.norm_eps) {
  check(config.n_heads % tp.size == 0 && config.ffn_hidden % tp.size == 0,
        "parallelism.tp = " + std::to_string(tp.size) + " must divide the " +
            std::to_string(config.n_heads) + " attention heads and the MLP width " +
            std::to_string(config.ffn_hidden) + ": pick a tp that divides both");
  A_ = heads_ * head_dim_;
  const std::string p = "transformer.h." + std::to_string(layer_index) + ".";
  const int64_t F = config.ffn_hidden;
  ln1_weight_ = store.declare(p + "ln_1.weight", {C_}, InitKind::ones, false);
  ln1_bias_ = store.declare(p + "ln_1.bias", {C_}, InitKind::zeros, false);
  // q, k, v column-parallel by heads (each rank its heads of each of the three blocks), the output
  // projection row-parallel; the MLP's c_fc column-parallel, its c_proj row-parallel.
  c_attn_ = Linear(store, p + "attn.c_attn", C_, 3 * C_, true, InitKind::normal, tp,
                   TensorSplit::column, 3);
  attn_proj_ = Linear(store, p + "attn.c_proj", C_, C_, true, InitKind::normal_residual, tp,
                      TensorSplit::row);
  ln2_weight_ = store.declare(p + "ln_2.weight", {C_}, InitKind::ones, false);
  ln2_bias_ = store.declare(p + "ln_2.bias", {C_}, InitKind::zeros, false);
  c_fc_ = Linear(store, p + "mlp.c_fc", C_, F, true, InitKind::normal, tp, TensorSplit::column);
  mlp_proj_ =
      Linear(store, p + "mlp.c_proj", F, C_, true, InitKind::normal_residual, tp, TensorSplit::row);
  F_ = c_fc_.out_features();
}

// q, k, v of `heads` heads packed per token as [q | k | v] (c_attn's output on this rank).
static k::AttentionShape packed_qkv_shape(int64_t B, int64_t T, int64_t heads, int64_t head_dim) {
  const int64_t width = heads * head_dim;
  k::AttentionShape s = k::AttentionShape::contiguous(B, T, heads, heads, head_dim);
  s.q_row_stride = s.k_row_stride = s.v_row_stride = 3 * width;
  s.q_batch_stride = s.kv_batch_stride = T * 3 * width;
  return s;
}

void Gpt2BlockActivations::release() {
  for (Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &qkv16, &att, &lse, &x2, &ln2, &ln2_mean,
                    &ln2_rstd, &fc, &gelu, &gelu_slope16, &d_qkv, &d_x2, &d_fc, &d_y})
    t->reset();
  for (LinearActivations* l : {&c_attn, &attn_proj, &c_fc, &mlp_proj}) l->release();
  weight_gradients_pending = false;
}

std::unique_ptr<BlockActivations> Gpt2Block::make_activations() const {
  return std::make_unique<Saved>();
}

int64_t Gpt2Block::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // prepare_activations' tensors and the Linears' kept bf16 inputs, per row of rows = B·T.
  const int64_t rows = B * T, C = C_, F = F_, A = A_;
  const int64_t stats = 2 * 2 * 4;      // LayerNorm 1 and 2: mean and rstd
  if (precision != k::Precision::bf16)  // ln1, qkv, x2, ln2, fc, gelu fp32 (att, lse below)
    return rows * (4 * (C + 3 * A + C + C + 2 * F) + stats) + attention_output_bytes(B, T);
  // bf16: c_attn's input and q, k, v in bf16; att and x2 fp32 with attn_proj's bf16 copy of att;
  // c_fc's input, the GELU slope and c_proj's input in bf16 (the fp32 pre-activation is the
  // backend's transient: Ops::linear_gelu_forward_bf16). A and F are this rank's widths.
  return rows * (2 * C + 6 * A + 2 * A + 4 * C + 2 * C + 2 * F + 2 * F + stats) +
         attention_output_bytes(B, T);
}

int64_t Gpt2Block::attention_output_bytes(int64_t B, int64_t T) const {
  return B * T * A_ * 4 + B * heads_ * T * 4;  // att [rows, A] and lse [B, H, T], fp32
}

int64_t Gpt2Block::scratch_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // backward_pass's scratch slots: d_gelu (fp32 [rows, F]; bf16: c_proj's rounded d_out), d_fc,
  // d_ln, d_x2, d_qkv, d_att.
  const int64_t rows = B * T;
  const int64_t slot0 = precision == k::Precision::bf16 ? (rows * C_ + 1) / 2 : rows * F_;
  return 4 * (slot0 + rows * F_ + rows * C_ + rows * C_ + rows * 3 * A_ + rows * A_);
}

void Gpt2Block::prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T,
                                    bool cached) {
  const int64_t rows = B * T;
  auto* tr = ctx.tracker;
  // In bf16 the LayerNorm outputs exist only as the next Linear's bf16 input (see qkv_forward),
  // and in bf16 training q, k, v only in bf16 (see qkv_forward).
  const bool bf16 = ctx.precision == k::Precision::bf16;
  if (bf16)
    a.ln1.reset();
  else
    ensure_activation(a.ln1, {rows, C_}, tr);
  ensure_activation(a.ln1_mean, {rows}, tr);
  ensure_activation(a.ln1_rstd, {rows}, tr);
  if (bf16 && !cached) {
    a.qkv.reset();
    ensure_bf16_activation(a.qkv16, {rows, 3 * A_}, tr);
  } else {
    a.qkv16.reset();
    ensure_activation(a.qkv, {rows, 3 * A_}, tr);
  }
  ensure_activation(a.att, {rows, A_}, tr);
  ensure_activation(a.lse, {B, heads_, T}, tr);
  ensure_activation(a.x2, {rows, C_}, tr);
  if (bf16)
    a.ln2.reset();
  else
    ensure_activation(a.ln2, {rows, C_}, tr);
  ensure_activation(a.ln2_mean, {rows}, tr);
  ensure_activation(a.ln2_rstd, {rows}, tr);
  // In bf16 the GELU output exists only as mlp_proj's bf16 input (see projection_and_mlp_forward),
  // and backward keeps the GELU's bf16 slope instead of the fp32 pre-activation, which the backend
  // never stores (see mlp_forward_bf16).
  if (bf16) {
    a.gelu.reset();
    a.fc.reset();
    ensure_bf16_activation(a.gelu_slope16, {rows, F_}, tr);
  } else {
    a.gelu_slope16.reset();
    ensure_activation(a.fc, {rows, F_}, tr);
    ensure_activation(a.gelu, {rows, F_}, tr);
  }
}

void Gpt2Block::qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows) {
  if (ctx.precision != k::Precision::bf16) {
    ctx.ops.layernorm_forward(a.ln1.f32(), a.ln1_mean.f32(), a.ln1_rstd.f32(), x_in,
                              store_.value(ln1_weight_), store_.value(ln1_bias_), rows, C_, eps_);
    c_attn_.forward(ctx, a.c_attn, a.qkv.f32(), a.ln1.f32(), rows);
    return;
  }
  // LayerNorm writes c_attn's bf16 input directly.
  ctx.ops.layernorm_forward_bf16(c_attn_.prepare_bf16_input(ctx, a.c_attn, rows), a.ln1_mean.f32(),
                                 a.ln1_rstd.f32(), x_in, store_.value(ln1_weight_),
                                 store_.value(ln1_bias_), rows, C_, eps_);
  if (a.qkv16.empty()) {  // cached inference: fp32 q, k, v for the KV cache
    c_attn_.forward_prepared(ctx, a.c_attn, a.qkv.f32(), rows);
    return;
  }
  // Training: c_attn's output (bias included) rounded to bf16 as it is produced: the same values
  // attention would round from an fp32 qkv, which is never stored.
  c_attn_.forward_prepared_to_bf16(ctx, a.c_attn, a.qkv16.data<lattice::bf16>(), rows);
}

void Gpt2Block::attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const k::AttentionShape shape = packed_qkv_shape(B, T, heads_, head_dim_);
  if (ctx.precision == k::Precision::bf16) {
    const lattice::bf16* qkv16 = a.qkv16.data<lattice::bf16>();
    ctx.ops.attention_forward_bf16(a.att.f32(), a.lse.f32(), qkv16, qkv16 + A_, qkv16 + 2 * A_,
                                   shape, {});
  } else {
    const float* qkv = a.qkv.f32();
    ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), qkv, qkv + A_, qkv + 2 * A_, shape,
                              ctx.precision, {});
  }
}

void Gpt2Block::projection_and_mlp_forward(const LayerContext& ctx, Saved& a, float* x_out,
                                           const float* x_in, int64_t rows) {
  attn_proj_.forward(ctx, a.attn_proj, a.x2.f32(), a.att.f32(), rows);
  all_reduce_over_tp(tp_, a.x2.f32(), rows * C_);  // the row-parallel projection's partial sums
  ctx.ops.add_inplace(a.x2.f32(), x_in, rows * C_);
  if (ctx.precision == k::Precision::bf16) {
    mlp_forward_bf16(ctx, a, x_out, rows);
  } else {
    ctx.ops.layernorm_forward(a.ln2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), a.x2.f32(),
                              store_.value(ln2_weight_), store_.value(ln2_bias_), rows, C_, eps_);
    c_fc_.forward(ctx, a.c_fc, a.fc.f32(), a.ln2.f32(), rows);
    ctx.ops.gelu_forward(a.gelu.f32(), a.fc.f32(), rows * F_);
    mlp_proj_.forward(ctx, a.mlp_proj, x_out, a.gelu.f32(), rows);
  }
  all_reduce_over_tp(tp_, x_out, rows * C_);
  ctx.ops.add_inplace(x_out, a.x2.f32(), rows * C_);
}

void Gpt2Block::mlp_forward_bf16(const LayerContext& ctx, Saved& a, float* x_out, int64_t rows) {
  // LayerNorm 2 writes c_fc's bf16 input and the GELU mlp_proj's: no fp32 copy of either exists.
  ctx.ops.layernorm_forward_bf16(c_fc_.prepare_bf16_input(ctx, a.c_fc, rows), a.ln2_mean.f32(),
                                 a.ln2_rstd.f32(), a.x2.f32(), store_.value(ln2_weight_),
                                 store_.value(ln2_bias_), rows, C_, eps_);
  // c_fc and the GELU in one op: the pre-activation is never stored; backward keeps the GELU's
  // bf16 slope.
  c_fc_.forward_prepared_gelu_bf16(ctx, a.c_fc, mlp_proj_.prepare_bf16_input(ctx, a.mlp_proj, rows),
                                   a.gelu_slope16.data<lattice::bf16>(), rows);
  mlp_proj_.forward_prepared(ctx, a.mlp_proj, x_out, rows);
}

void Gpt2Block::forward(const LayerContext& ctx, BlockActivations& saved, float* x_out,
                        const float* x_in, int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T;
  prepare_activations(ctx, a, B, T, /*cached=*/false);
  qkv_forward(ctx, a, x_in, rows);
  attention_core(ctx, a, B, T);
  projection_and_mlp_forward(ctx, a, x_out, x_in, rows);
  drop_recomputed_attention(a, a.att, a.lse);  // selective checkpointing: recomputed in backward
}

void Gpt2Block::backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                              const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                              BackwardScratch& scratch, bool defer) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T;
  auto* tr = ctx.tracker;
  const bool bf16 = ctx.precision == k::Precision::bf16;
  if (a.recompute_attention && a.att.empty()) {  // selective checkpointing: the attention again
    ensure_activation(a.att, {rows, A_}, tr);
    ensure_activation(a.lse, {B, heads_, T}, tr);
    attention_core(ctx, a, B, T);
    // attn_proj's bf16 input was rounded from these same values: it stays valid.
    if (!a.attn_proj.prepared && a.attn_proj.rounded_from != nullptr)
      a.attn_proj.rounded_from = a.att.f32();
  }
  // The gradients each Linear's weight half reads: scratch when it runs here, kept in `a` when
  // backward_weight runs it later.
  auto kept = [&](Tensor& pending, int slot, int64_t numel) {
    return weight_gradient_operand(defer, pending, scratch, slot, numel, tr);
  };
  // d gelu output: fp32 [rows, F]; in bf16 only c_proj's rounded d_out [rows, C] (d_gelu stays
  // in per-chunk buffers, see mlp_backward_bf16).
  float* d_y16_or_gelu = bf16 ? kept(a.d_y, 0, (rows * C_ + 1) / 2) : scratch.get(0, rows * F_, tr);
  float* d_fc = kept(a.d_fc, 5, rows * F_);     // fp32, or bf16 in its first half (bf16 precision)
  float* d_ln = scratch.get(1, rows * C_, tr);  // d of a LayerNorm output
  float* d_x2 = kept(a.d_x2, 2, rows * C_);     // d residual after attention
  float* d_qkv = kept(a.d_qkv, 3, rows * 3 * A_);  // d q, k, v packed
  float* d_att = scratch.get(4, rows * A_, tr);
  // Tensor parallelism: a column-parallel layer's input gradient is all-reduced over tp while its
  // weight gradient is computed (its input half, the reduction started, the weight half, the
  // wait); without overlap (or when the weight half is deferred) the reduction blocks.
  const bool overlap = tp_.size > 1 && tp_.overlap && !defer;
  const bool input_half_only = defer || overlap;
  auto reduce_input_gradient = [&](auto&& weight_half) {
    if (!overlap) {
      all_reduce_over_tp(tp_, d_ln, rows * C_);
      return;
    }
    TpReduction reduction(tp_, d_ln, rows * C_);
    weight_half();
    reduction.wait();
  };

  // MLP branch: x_out = x2 + c_proj(gelu(c_fc(ln2(x2)))).
  if (bf16) {
    mlp_backward_bf16(ctx, a, d_ln, d_x_out, d_fc, d_y16_or_gelu, rows, defer, input_half_only);
  } else {
    float* d_gelu = d_y16_or_gelu;
    if (defer) {  // d_x_out may be overwritten by d_x_in below: c_proj's W keeps its own copy
      ctx.ops.copy(kept(a.d_y, 0, rows * C_), d_x_out, rows * C_);
      mlp_proj_.backward_input(ctx, a.mlp_proj, d_gelu, d_x_out, rows);
    } else {
      mlp_proj_.backward(ctx, a.mlp_proj, d_gelu, d_x_out, a.gelu.f32(), rows);
    }
    ctx.ops.gelu_backward(d_fc, d_gelu, a.fc.f32(), rows * F_);
    if (input_half_only)
      c_fc_.backward_input(ctx, a.c_fc, d_ln, d_fc, rows);
    else
      c_fc_.backward(ctx, a.c_fc, d_ln, d_fc, a.ln2.f32(), rows);
  }
  reduce_input_gradient([&] {  // the column-parallel c_fc's partial input gradients
    if (bf16)
      c_fc_.backward_rounded(ctx, a.c_fc, nullptr, reinterpret_cast<const lattice::bf16*>(d_fc),
                             a.ln2.f32(), rows);
    else
      c_fc_.backward_weight(ctx, a.c_fc, d_fc, a.ln2.f32(), rows);
  });
  ctx.ops.layernorm_backward(d_x2, store_.grad(ln2_weight_), store_.grad(ln2_bias_), d_ln,
                             a.x2.f32(), store_.value(ln2_weight_), a.ln2_mean.f32(),
                             a.ln2_rstd.f32(), rows, C_, /*residual_grad=*/d_x_out);

  // Attention branch: x2 = x_in + c_proj(attention(c_attn(ln1(x_in)))).
  if (defer)
    attn_proj_.backward_input(ctx, a.attn_proj, d_att, d_x2, rows);
  else
    attn_proj_.backward(ctx, a.attn_proj, d_att, d_x2, a.att.f32(), rows);
  if (bf16) {
    attention_backward_bf16(ctx, a, d_ln, d_att, d_qkv, B, T, input_half_only);
  } else {
    const float* qkv = a.qkv.f32();
    ctx.ops.attention_backward(d_qkv, d_qkv + A_, d_qkv + 2 * A_, d_att, qkv, qkv + A_,
                               qkv + 2 * A_, a.att.f32(), a.lse.f32(),
                               packed_qkv_shape(B, T, heads_, head_dim_), ctx.precision, {});
    if (input_half_only)
      c_attn_.backward_input(ctx, a.c_attn, d_ln, d_qkv, rows);
    else
      c_attn_.backward(ctx, a.c_attn, d_ln, d_qkv, a.ln1.f32(), rows);
  }
  reduce_input_gradient([&] {
    if (bf16)
      c_attn_.backward_rounded(ctx, a.c_attn, nullptr,
                               reinterpret_cast<const lattice::bf16*>(d_qkv), nullptr, rows);
    else
      c_attn_.backward_weight(ctx, a.c_attn, d_qkv, a.ln1.f32(), rows);
  });
  ctx.ops.layernorm_backward(d_x_in, store_.grad(ln1_weight_), store_.grad(ln1_bias_), d_ln, x_in,
                             store_.value(ln1_weight_), a.ln1_mean.f32(), a.ln1_rstd.f32(), rows,
                             C_, /*residual_grad=*/d_x2);
  if (!defer) drop_recomputed_attention(a, a.att, a.lse);
}

void Gpt2Block::weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                            int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T;
  if (ctx.precision == k::Precision::bf16) {
    mlp_proj_.backward_rounded(ctx, a.mlp_proj, nullptr,
                               reinterpret_cast<const lattice::bf16*>(a.d_y.f32()), nullptr, rows);
    c_fc_.backward_rounded(ctx, a.c_fc, nullptr,
                           reinterpret_cast<const lattice::bf16*>(a.d_fc.f32()), a.ln2.f32(), rows);
    attn_proj_.backward_weight(ctx, a.attn_proj, a.d_x2.f32(), a.att.f32(), rows);
    c_attn_.backward_rounded(ctx, a.c_attn, nullptr,
                             reinterpret_cast<const lattice::bf16*>(a.d_qkv.f32()), nullptr, rows);
  } else {
    mlp_proj_.backward_weight(ctx, a.mlp_proj, a.d_y.f32(), a.gelu.f32(), rows);
    c_fc_.backward_weight(ctx, a.c_fc, a.d_fc.f32(), a.ln2.f32(), rows);
    attn_proj_.backward_weight(ctx, a.attn_proj, a.d_x2.f32(), a.att.f32(), rows);
    c_attn_.backward_weight(ctx, a.c_attn, a.d_qkv.f32(), a.ln1.f32(), rows);
  }
  for (Tensor* t : {&a.d_qkv, &a.d_x2, &a.d_fc, &a.d_y}) t->reset();
  drop_recomputed_attention(a, a.att, a.lse);
}

void Gpt2Block::attention_backward_bf16(const LayerContext& ctx, Saved& a, float* d_ln,
                                        const float* d_att, float* d_qkv_buffer, int64_t B,
                                        int64_t T, bool input_half_only) {
  const int64_t rows = B * T;
  auto* d_qkv16 = reinterpret_cast<lattice::bf16*>(d_qkv_buffer);
  const lattice::bf16* qkv16 = a.qkv16.data<lattice::bf16>();
  // c_attn's bias gradient comes out of the attention backward (the column sums of the unrounded
  // d q, k, v, in an order fixed by the shape).
  ctx.ops.attention_backward_bf16(d_qkv16, d_qkv16 + A_, d_qkv16 + 2 * A_, c_attn_.bias_grad(),
                                  d_att, qkv16, qkv16 + A_, qkv16 + 2 * A_, a.att.f32(),
                                  a.lse.f32(), packed_qkv_shape(B, T, heads_, head_dim_), {});
  if (input_half_only)
    c_attn_.backward_input_rounded(ctx, d_ln, d_qkv16, rows);
  else
    c_attn_.backward_rounded(ctx, a.c_attn, d_ln, d_qkv16, nullptr, rows);
}

void Gpt2Block::mlp_backward_bf16(const LayerContext& ctx, Saved& a, float* d_ln,
                                  const float* d_x_out, float* d_fc_buffer, float* d_y_buffer,
                                  int64_t rows, bool defer, bool fc_input_half_only) {
  // c_proj's d_out rounded once (with its bias gradient) for its weight gradient and for d_gelu.
  auto* d_y16 = reinterpret_cast<lattice::bf16*>(d_y_buffer);
  ctx.ops.round_with_column_sums(d_y16, mlp_proj_.bias_grad(), d_x_out, rows, C_);
  if (!defer) mlp_proj_.backward_rounded(ctx, a.mlp_proj, nullptr, d_y16, nullptr, rows);
  // d_gelu = d_y · W_proj taken through the GELU backward into c_fc's bf16 d_out (with c_fc's
  // bias gradient): the fp32 d_gelu is never stored.
  auto* d_fc16 = reinterpret_cast<lattice::bf16*>(d_fc_buffer);
  mlp_proj_.backward_input_through_gelu_bf16(ctx, d_fc16, c_fc_.bias_grad(), d_y16,
                                             a.gelu_slope16.data<lattice::bf16>(), rows);
  if (fc_input_half_only)
    c_fc_.backward_input_rounded(ctx, d_ln, d_fc16, rows);
  else
    c_fc_.backward_rounded(ctx, a.c_fc, d_ln, d_fc16, a.ln2.f32(), rows);
}

void Gpt2Block::forward_cached(const LayerContext& ctx, BlockActivations& work, float* x_out,
                               const float* x_in, int64_t B, int64_t n, KvCache& cache,
                               int64_t cache_layer) {
  Saved& a = saved_as<Saved>(work);
  check(tp_.size == 1,
        "KV-cached generation runs on one rank: generate from the run's (logical) checkpoint");
  const int64_t rows = B * n;
  prepare_activations(ctx, a, B, n, /*cached=*/true);
  qkv_forward(ctx, a, x_in, rows);
  const float* qkv = a.qkv.f32();
  cache.write(cache_layer, qkv + A_, qkv + 2 * A_, 3 * A_, n);
  // The new queries sit at the end of the cached keys: positions [length, length + n).
  k::AttentionShape shape = packed_qkv_shape(B, n, heads_, head_dim_);
  shape.kv_len = cache.length() + n;
  shape.k_row_stride = shape.v_row_stride = cache.row_stride();
  shape.kv_batch_stride = cache.batch_stride();
  ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), qkv, cache.keys(cache_layer),
                            cache.values(cache_layer), shape, ctx.precision, {});
  projection_and_mlp_forward(ctx, a, x_out, x_in, rows);
}

}  // namespace lattice::model
