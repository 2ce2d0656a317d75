// GPT-2 transformer block: see gpt2_block.hpp.
#include "lattice/model/gpt2_block.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/context_parallel.hpp"
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
  for (Tensor* t : {&ln1,  &ln1_16,       &ln2_16, &ln1_mean, &ln1_rstd, &qkv,      &qkv16,
                    &att,  &lse,          &x2,     &ln2,      &ln2_mean, &ln2_rstd, &fc,
                    &gelu, &gelu_slope16, &d_qkv,  &d_x2,     &d_fc,     &d_y})
    t->reset();
  for (LinearActivations* l : {&c_attn, &attn_proj, &c_fc, &mlp_proj}) l->release();
  weight_gradients_pending = false;
}

std::unique_ptr<BlockActivations> Gpt2Block::make_activations() const {
  return std::make_unique<Saved>();
}

int64_t Gpt2Block::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // prepare_activations' tensors and the Linears' kept bf16 inputs: per row of rows = B·T for what
  // is split by heads or MLP channels (A and F are this rank's widths), per row of this rank's
  // sequence rows (local = rows / tp under sequence parallelism) for the norms and the residual.
  const int64_t rows = B * T, local = tp_.local_rows(rows), C = C_, F = F_, A = A_;
  const int64_t stats = 2 * 2 * 4;      // LayerNorm 1 and 2: mean and rstd
  if (precision != k::Precision::bf16)  // ln1, x2, ln2 (local); qkv, fc, gelu fp32 (att, lse below)
    return local * (4 * 3 * C + stats) + rows * 4 * (3 * A + 2 * F) + attention_output_bytes(B, T);
  // bf16: the LayerNorm outputs in bf16 (c_attn's and c_fc's inputs; under sequence parallelism
  // this rank's rows, gathered again in backward) and x2 fp32; q, k, v in bf16, att fp32 with
  // attn_proj's bf16 copy, the GELU slope and c_proj's input in bf16 (the fp32 pre-activation is
  // the backend's transient: Ops::linear_gelu_forward_bf16).
  return local * (2 * C + 4 * C + 2 * C + stats) + rows * (6 * A + 2 * A + 2 * F + 2 * F) +
         attention_output_bytes(B, T);
}

int64_t Gpt2Block::attention_output_bytes(int64_t B, int64_t T) const {
  return B * T * A_ * 4 + B * heads_ * T * 4;  // att [rows, A] and lse [B, H, T], fp32
}

int64_t Gpt2Block::scratch_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // backward_pass's scratch slots: d_gelu (fp32 [rows, F]; bf16: c_proj's rounded d_out), d_fc,
  // d_ln and d_x2 (this rank's rows), d_qkv, d_att. Sequence parallelism adds the gathered d_y
  // (then d_x2, in the same slot) and the column layers' partial d_ln over all rows (fp32 [rows, C]
  // each), the norm weights' partial gradients, and in fp32 the column layers' inputs gathered
  // again for their weight gradients (bf16 gathers them into the Linear's kept input, a transient:
  // transient_bytes).
  const int64_t rows = B * T, local = tp_.local_rows(rows);
  const bool bf16 = precision == k::Precision::bf16;
  const int64_t slot0 = bf16 ? (rows * C_ + 1) / 2 : rows * F_;
  int64_t floats = slot0 + rows * F_ + 2 * local * C_ + rows * 3 * A_ + rows * A_;
  if (tp_.sequence_parallel) floats += 2 * rows * C_ + 2 * C_ + (bf16 ? 0 : rows * C_);
  return 4 * floats;
}

int64_t Gpt2Block::transient_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // Sequence parallelism: the MLP forward's is the largest — the partial sums before the
  // reduce-scatter (fp32 [rows, C]) with c_fc's gathered input (fp32, or bf16 in its kept input,
  // freed after the GEMM). Backward's gathered bf16 inputs are smaller.
  if (!tp_.sequence_parallel) return 0;
  const int64_t rows = B * T;
  return rows * C_ * (4 + (precision == k::Precision::bf16 ? 2 : 4));
}

int64_t Gpt2Block::pending_weight_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // What backward_input keeps (its `kept` operands): c_proj's output gradient (bf16: rounded, in
  // half the floats), c_fc's, the attention projection's (over all rows) and c_attn's.
  const int64_t rows = B * T;
  const int64_t d_y = precision == k::Precision::bf16 ? (rows * C_ + 1) / 2 : rows * C_;
  return 4 * (d_y + rows * F_ + rows * C_ + rows * 3 * A_);
}

void Gpt2Block::prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T,
                                    bool cached) {
  const int64_t rows = B * T, local = tp_.local_rows(rows);
  auto* tr = ctx.tracker;
  // In bf16 the LayerNorm outputs exist only as the next Linear's bf16 input (see
  // norm_into_column; under sequence parallelism this rank's rows of it), and in bf16 training
  // q, k, v only in bf16 (see qkv_forward).
  const bool bf16 = ctx.precision == k::Precision::bf16;
  for (Tensor* ln : {&a.ln1, &a.ln2}) {
    if (bf16)
      ln->reset();
    else
      ensure_activation(*ln, {local, C_}, tr);
  }
  for (Tensor* ln16 : {&a.ln1_16, &a.ln2_16}) {
    if (bf16 && tp_.sequence_parallel)
      ensure_bf16_activation(*ln16, {local, C_}, tr);
    else
      ln16->reset();
  }
  for (Tensor* stats : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd})
    ensure_activation(*stats, {local}, tr);
  if (bf16 && !cached) {
    a.qkv.reset();
    ensure_bf16_activation(a.qkv16, {rows, 3 * A_}, tr);
  } else {
    a.qkv16.reset();
    ensure_activation(a.qkv, {rows, 3 * A_}, tr);
  }
  ensure_activation(a.att, {rows, A_}, tr);
  ensure_activation(a.lse, {B, heads_, T}, tr);
  ensure_activation(a.x2, {local, C_}, tr);
  // In bf16 the GELU output exists only as mlp_proj's bf16 input (see projection_and_mlp_forward),
  // and backward keeps the GELU's bf16 slope instead of the fp32 pre-activation, which the backend
  // never stores (see projection_and_mlp_forward).
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

TpCollective Gpt2Block::norm_into_column(const LayerContext& ctx, Linear& layer,
                                         LinearActivations& saved, Tensor& out, Tensor& out16,
                                         Tensor& mean, Tensor& rstd, const float* x, int weight,
                                         int bias, Tensor& gathered, int64_t rows,
                                         const float** input) {
  const int64_t local = tp_.local_rows(rows);
  const bool sp = tp_.sequence_parallel;
  const float* w = store_.value(weight);
  const float* b = store_.value(bias);
  if (ctx.precision != k::Precision::bf16) {
    ctx.ops.layernorm_forward(out.f32(), mean.f32(), rstd.f32(), x, w, b, local, C_, eps_);
    *input = out.f32();
    if (!sp) return TpCollective::none(tp_);
    ensure_activation(gathered, {rows, C_}, ctx.tracker);
    *input = gathered.f32();
    return TpCollective::gather(tp_, gathered.f32(), out.f32(), rows, C_);
  }
  // The LayerNorm writes the layer's bf16 input directly (this rank's rows of it, gathered).
  *input = nullptr;
  lattice::bf16* in16 = layer.prepare_bf16_input(ctx, saved, rows);
  lattice::bf16* own = sp ? out16.data<lattice::bf16>() : in16;
  ctx.ops.layernorm_forward_bf16(own, mean.f32(), rstd.f32(), x, w, b, local, C_, eps_);
  if (!sp) return TpCollective::none(tp_);
  return TpCollective::gather(tp_, in16, own, rows, C_, DType::bf16);
}

TpCollective Gpt2Block::regather_column_input(const LayerContext& ctx, Linear& layer,
                                              LinearActivations& saved, const Tensor& out,
                                              const Tensor& out16, float* gathered, int64_t rows,
                                              const float** input) {
  const bool bf16 = ctx.precision == k::Precision::bf16;
  *input = bf16 ? nullptr : out.f32();
  if (!tp_.sequence_parallel) return TpCollective::none(tp_);
  *input = bf16 ? nullptr : gathered;
  TpCollective gather =
      bf16 ? TpCollective::gather(tp_, layer.refill_prepared_input(ctx, saved, rows),
                                  out16.data<lattice::bf16>(), rows, C_, DType::bf16)
           : TpCollective::gather(tp_, gathered, out.f32(), rows, C_);
  if (!tp_.overlap) gather.wait();  // measuring what the overlap hides: blocking
  return gather;
}

void Gpt2Block::qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows) {
  Tensor gathered;  // fp32 sequence parallelism: LayerNorm 1's output over all rows, for the GEMM
  const float* in = nullptr;
  TpCollective gather =
      norm_into_column(ctx, c_attn_, a.c_attn, a.ln1, a.ln1_16, a.ln1_mean, a.ln1_rstd, x_in,
                       ln1_weight_, ln1_bias_, gathered, rows, &in);
  const int64_t width = c_attn_.out_features();
  if (ctx.precision != k::Precision::bf16) {
    column_parallel_forward(
        tp_, gather,
        [&](int64_t first, int64_t count, bool own) {
          if (own)
            c_attn_.forward_piece(ctx, a.c_attn, a.qkv.f32() + first * width, a.ln1.f32(), rows,
                                  first, count);
          else
            c_attn_.forward_rows(ctx, a.c_attn, a.qkv.f32(), in, rows, first, count);
        },
        rows);
  } else if (a.qkv16.empty()) {  // cached inference (one rank): fp32 q, k, v for the KV cache
    gather.wait();
    c_attn_.forward_prepared(ctx, a.c_attn, a.qkv.f32(), rows);
  } else {
    // Training: c_attn's output (bias included) rounded to bf16 as it is produced: the same values
    // attention would round from an fp32 qkv, which is never stored.
    column_parallel_forward(
        tp_, gather,
        [&](int64_t first, int64_t count, bool own) {
          c_attn_.forward_prepared_to_bf16_rows(ctx, a.c_attn, a.qkv16.data<lattice::bf16>(), rows,
                                                first, count,
                                                own ? a.ln1_16.data<lattice::bf16>() : nullptr);
        },
        rows);
  }
  // Sequence parallelism keeps this rank's rows (ln1_16), not the gathered input.
  if (tp_.sequence_parallel) Linear::release_prepared_input(a.c_attn);
}

// Context parallelism in bf16: the attention spanning the ranks takes fp32 q, k, v (a transient
// exact copy of the bf16 ones: the same rounding as the bf16 kernels, which read them rounded).
static Tensor widened_qkv(const LayerContext& ctx, const Tensor& qkv16, int64_t rows,
                          int64_t width) {
  Tensor wide({rows, width}, DType::f32, ctx.tracker, MemoryCategory::activations);
  ctx.ops.convert_to_f32(wide.f32(), qkv16.data<lattice::bf16>(), rows * width);
  return wide;
}

void Gpt2Block::attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const k::AttentionShape shape = packed_qkv_shape(B, T, heads_, head_dim_);
  if (ctx.context != nullptr) {
    const bool bf16 = ctx.precision == k::Precision::bf16;
    const Tensor wide = bf16 ? widened_qkv(ctx, a.qkv16, B * T, 3 * A_) : Tensor();
    const float* qkv = bf16 ? wide.f32() : a.qkv.f32();
    ctx.context->forward(ctx.ops, a.att.f32(), a.lse.f32(), qkv, qkv + A_, qkv + 2 * A_, shape,
                         ctx.precision);
    return;
  }
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
  const int64_t local = tp_.local_rows(rows);
  const bool sp = tp_.sequence_parallel;
  // The row-parallel projections' partial sums over all rows, reduced over tp: all-reduced in
  // place, or reduce-scattered onto this rank's rows from `partial` under sequence parallelism.
  Tensor partial;
  if (sp) ensure_activation(partial, {rows, C_}, ctx.tracker);
  float* attn_out = sp ? partial.f32() : a.x2.f32();
  row_parallel_forward(
      tp_,
      [&](int64_t first, int64_t count) {
        attn_proj_.forward_rows(ctx, a.attn_proj, attn_out, a.att.f32(), rows, first, count);
      },
      a.x2.f32(), attn_out, rows, C_);
  ctx.ops.add_inplace(a.x2.f32(), x_in, local * C_);
  Tensor gathered;
  const float* ln2 = nullptr;
  TpCollective gather =
      norm_into_column(ctx, c_fc_, a.c_fc, a.ln2, a.ln2_16, a.ln2_mean, a.ln2_rstd, a.x2.f32(),
                       ln2_weight_, ln2_bias_, gathered, rows, &ln2);
  float* mlp_out = sp ? partial.f32() : x_out;
  const bool bf16 = ctx.precision == k::Precision::bf16;
  if (bf16) {
    // c_fc and the GELU in one op on the LayerNorm's bf16 output: the pre-activation is never
    // stored, and the GELU is written as mlp_proj's bf16 input; backward keeps its bf16 slope.
    lattice::bf16* gelu16 = mlp_proj_.prepare_bf16_input(ctx, a.mlp_proj, rows);
    column_parallel_forward(
        tp_, gather,
        [&](int64_t first, int64_t count, bool own) {
          c_fc_.forward_prepared_gelu_bf16_rows(
              ctx, a.c_fc, gelu16, a.gelu_slope16.data<lattice::bf16>(), rows, first, count,
              own ? a.ln2_16.data<lattice::bf16>() : nullptr);
        },
        rows);
    if (sp) Linear::release_prepared_input(a.c_fc);
  } else {
    column_parallel_forward(
        tp_, gather,
        [&](int64_t first, int64_t count, bool own) {
          if (own)
            c_fc_.forward_piece(ctx, a.c_fc, a.fc.f32() + first * F_, a.ln2.f32(), rows, first,
                                count);
          else
            c_fc_.forward_rows(ctx, a.c_fc, a.fc.f32(), ln2, rows, first, count);
        },
        rows);
    gathered.reset();
    ctx.ops.gelu_forward(a.gelu.f32(), a.fc.f32(), rows * F_);
  }
  row_parallel_forward(
      tp_,
      [&](int64_t first, int64_t count) {
        if (bf16)
          mlp_proj_.forward_prepared_rows(ctx, a.mlp_proj, mlp_out, rows, first, count);
        else
          mlp_proj_.forward_rows(ctx, a.mlp_proj, mlp_out, a.gelu.f32(), rows, first, count);
      },
      x_out, mlp_out, rows, C_);
  ctx.ops.add_inplace(x_out, a.x2.f32(), local * C_);
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
  const int64_t rows = B * T, local = tp_.local_rows(rows);
  auto* tr = ctx.tracker;
  const bool bf16 = ctx.precision == k::Precision::bf16;
  const bool sp = tp_.sequence_parallel;
  if (a.recompute_attention && a.att.empty()) {  // selective checkpointing: the attention again
    ensure_activation(a.att, {rows, A_}, tr);
    ensure_activation(a.lse, {B, heads_, T}, tr);
    attention_core(ctx, a, B, T);
    // attn_proj's bf16 input was rounded from these same values: it stays valid.
    if (!a.attn_proj.prepared && a.attn_proj.rounded_from != nullptr)
      a.attn_proj.rounded_from = a.att.f32();
  }
  // The gradients each Linear's weight half reads: scratch when it runs here, kept in `a` when
  // backward_weight runs it later. d_x_out, d_x_in, d_ln and d_x2 hold this rank's rows (local);
  // the rest all rows.
  auto kept = [&](Tensor& pending, int slot, int64_t numel) {
    return weight_gradient_operand(defer, pending, scratch, slot, numel, tr);
  };
  // d gelu output: fp32 [rows, F]; in bf16 only c_proj's rounded d_out [rows, C] (d_gelu stays
  // in per-chunk buffers, see mlp_backward_bf16).
  float* d_y16_or_gelu = bf16 ? kept(a.d_y, 0, (rows * C_ + 1) / 2) : scratch.get(0, rows * F_, tr);
  float* d_fc = kept(a.d_fc, 5, rows * F_);      // fp32, or bf16 in its first half (bf16 precision)
  float* d_ln = scratch.get(1, local * C_, tr);  // d of a LayerNorm output
  float* d_x2 = sp ? scratch.get(2, local * C_, tr) : kept(a.d_x2, 2, rows * C_);
  float* d_qkv = kept(a.d_qkv, 3, rows * 3 * A_);  // d q, k, v packed
  float* d_att = scratch.get(4, rows * A_, tr);
  // Sequence parallelism: the row-parallel layers' output gradients over all rows (gathered from
  // every rank's), the column-parallel layers' partial input gradients over all rows (before their
  // reduce-scatter onto d_ln), a column layer's input gathered again, the norms' partial weight
  // gradients. Without it these are d_x_out, d_x2, d_ln and the saved LayerNorm outputs.
  const float* d_y = d_x_out;
  if (sp) {
    float* gathered = !bf16 && defer ? kept(a.d_y, 0, rows * C_) : scratch.get(6, rows * C_, tr);
    gather_sequence(tp_, gathered, d_x_out, rows, C_);
    d_y = gathered;
  } else if (!bf16 && defer) {  // d_x_out may be overwritten by d_x_in: c_proj's W keeps a copy
    float* copy = kept(a.d_y, 0, rows * C_);
    ctx.ops.copy(copy, d_x_out, rows * C_);
    d_y = copy;
  }
  float* d_ln_rows = sp ? scratch.get(9, rows * C_, tr) : d_ln;
  float* gathered_input = sp && !bf16 ? scratch.get(7, rows * C_, tr) : nullptr;
  float* norm_grads = sp ? scratch.get(8, 2 * C_, tr) : nullptr;
  // With tensor parallelism the column-parallel layers run their halves apart: the input half
  // into d_ln_rows, then its partial sums reduced onto d_ln (all-reduce, or reduce-scatter under
  // sequence parallelism) while the weight half runs (TensorParallelGroup::overlap; without it,
  // or when the weight half is deferred, the reduction blocks). Under sequence parallelism the
  // weight half's input is gathered again first, while the input half runs.
  const bool split = defer || tp_.size > 1;
  auto finish_column = [&](TpCollective& input_gather, auto&& weight_half) {
    if (!split) return;
    TpCollective reduction = TpCollective::reduce(tp_, d_ln, d_ln_rows, rows, C_);
    if (!tp_.overlap) reduction.wait();
    if (!defer) {
      input_gather.wait();
      weight_half();
    }
    reduction.wait();
  };
  auto norm_backward = [&](float* d_in, int weight, int bias, const float* x, const Tensor& mean,
                           const Tensor& rstd, const float* residual_grad) {
    ReplicatedGradients grads(tp_, ctx.ops, {store_.grad(weight), store_.grad(bias)}, C_,
                              norm_grads);
    ctx.ops.layernorm_backward(d_in, grads.target(0), grads.target(1), d_ln, x,
                               store_.value(weight), mean.f32(), rstd.f32(), local, C_,
                               residual_grad);
    grads.finish();
  };

  // MLP branch: x_out = x2 + c_proj(gelu(c_fc(ln2(x2)))).
  const float* ln2 = nullptr;
  TpCollective ln2_gather = defer ? TpCollective::none(tp_)
                                  : regather_column_input(ctx, c_fc_, a.c_fc, a.ln2, a.ln2_16,
                                                          gathered_input, rows, &ln2);
  if (bf16) {
    mlp_backward_bf16(ctx, a, d_ln_rows, d_y, d_fc, d_y16_or_gelu, rows, defer, split);
  } else {
    float* d_gelu = d_y16_or_gelu;
    if (defer)
      mlp_proj_.backward_input(ctx, a.mlp_proj, d_gelu, d_y, rows);
    else
      mlp_proj_.backward(ctx, a.mlp_proj, d_gelu, d_y, a.gelu.f32(), rows);
    ctx.ops.gelu_backward(d_fc, d_gelu, a.fc.f32(), rows * F_);
    if (split)
      c_fc_.backward_input(ctx, a.c_fc, d_ln_rows, d_fc, rows);
    else
      c_fc_.backward(ctx, a.c_fc, d_ln, d_fc, a.ln2.f32(), rows);
  }
  finish_column(ln2_gather, [&] {  // the column-parallel c_fc's weight half
    if (bf16)
      c_fc_.backward_rounded(ctx, a.c_fc, nullptr, reinterpret_cast<const lattice::bf16*>(d_fc),
                             nullptr, rows);
    else
      c_fc_.backward_weight(ctx, a.c_fc, d_fc, ln2, rows);
  });
  if (sp && bf16 && !defer) Linear::release_prepared_input(a.c_fc);
  norm_backward(d_x2, ln2_weight_, ln2_bias_, a.x2.f32(), a.ln2_mean, a.ln2_rstd, d_x_out);

  // Attention branch: x2 = x_in + c_proj(attention(c_attn(ln1(x_in)))).
  float* d_x2_rows = d_x2;  // the row-parallel projection's d_out over all rows
  if (sp) {
    d_x2_rows = kept(a.d_x2, 6, rows * C_);  // d_y's slot: the MLP branch is done with it
    gather_sequence(tp_, d_x2_rows, d_x2, rows, C_);
  }
  const float* ln1 = nullptr;
  TpCollective ln1_gather = defer ? TpCollective::none(tp_)
                                  : regather_column_input(ctx, c_attn_, a.c_attn, a.ln1, a.ln1_16,
                                                          gathered_input, rows, &ln1);
  if (defer)
    attn_proj_.backward_input(ctx, a.attn_proj, d_att, d_x2_rows, rows);
  else
    attn_proj_.backward(ctx, a.attn_proj, d_att, d_x2_rows, a.att.f32(), rows);
  if (bf16) {
    attention_backward_bf16(ctx, a, d_ln_rows, d_att, d_qkv, B, T, split);
  } else {
    const float* qkv = a.qkv.f32();
    const k::AttentionShape shape = packed_qkv_shape(B, T, heads_, head_dim_);
    if (ctx.context != nullptr)
      ctx.context->backward(ctx.ops, d_qkv, d_qkv + A_, d_qkv + 2 * A_, d_att, qkv, qkv + A_,
                            qkv + 2 * A_, a.att.f32(), a.lse.f32(), shape, ctx.precision);
    else
      ctx.ops.attention_backward(d_qkv, d_qkv + A_, d_qkv + 2 * A_, d_att, qkv, qkv + A_,
                                 qkv + 2 * A_, a.att.f32(), a.lse.f32(), shape, ctx.precision, {});
    if (split)
      c_attn_.backward_input(ctx, a.c_attn, d_ln_rows, d_qkv, rows);
    else
      c_attn_.backward(ctx, a.c_attn, d_ln, d_qkv, a.ln1.f32(), rows);
  }
  finish_column(ln1_gather, [&] {
    if (bf16)
      c_attn_.backward_rounded(ctx, a.c_attn, nullptr,
                               reinterpret_cast<const lattice::bf16*>(d_qkv), nullptr, rows);
    else
      c_attn_.backward_weight(ctx, a.c_attn, d_qkv, ln1, rows);
  });
  if (sp && bf16 && !defer) Linear::release_prepared_input(a.c_attn);
  norm_backward(d_x_in, ln1_weight_, ln1_bias_, x_in, a.ln1_mean, a.ln1_rstd, d_x2);
  if (!defer) drop_recomputed_attention(a, a.att, a.lse);
}

void Gpt2Block::weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                            int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  (void)x_in;
  const int64_t rows = B * T;
  // The column layers' inputs over all rows: gathered again under sequence parallelism (into a
  // transient fp32 buffer, or into the Linears' kept bf16 inputs), else the saved LayerNorm
  // outputs.
  Tensor gathered;
  if (tp_.sequence_parallel && ctx.precision != k::Precision::bf16)
    ensure_activation(gathered, {2 * rows, C_}, ctx.tracker);
  const float *ln1 = nullptr, *ln2 = nullptr;
  float* buffer = gathered.empty() ? nullptr : gathered.f32();
  regather_column_input(ctx, c_fc_, a.c_fc, a.ln2, a.ln2_16, buffer, rows, &ln2).wait();
  regather_column_input(ctx, c_attn_, a.c_attn, a.ln1, a.ln1_16,
                        buffer == nullptr ? nullptr : buffer + rows * C_, rows, &ln1)
      .wait();
  if (ctx.precision == k::Precision::bf16) {
    mlp_proj_.backward_rounded(ctx, a.mlp_proj, nullptr,
                               reinterpret_cast<const lattice::bf16*>(a.d_y.f32()), nullptr, rows);
    c_fc_.backward_rounded(ctx, a.c_fc, nullptr,
                           reinterpret_cast<const lattice::bf16*>(a.d_fc.f32()), nullptr, rows);
    attn_proj_.backward_weight(ctx, a.attn_proj, a.d_x2.f32(), a.att.f32(), rows);
    c_attn_.backward_rounded(ctx, a.c_attn, nullptr,
                             reinterpret_cast<const lattice::bf16*>(a.d_qkv.f32()), nullptr, rows);
  } else {
    mlp_proj_.backward_weight(ctx, a.mlp_proj, a.d_y.f32(), a.gelu.f32(), rows);
    c_fc_.backward_weight(ctx, a.c_fc, a.d_fc.f32(), ln2, rows);
    attn_proj_.backward_weight(ctx, a.attn_proj, a.d_x2.f32(), a.att.f32(), rows);
    c_attn_.backward_weight(ctx, a.c_attn, a.d_qkv.f32(), ln1, rows);
  }
  if (tp_.sequence_parallel) {
    Linear::release_prepared_input(a.c_fc);
    Linear::release_prepared_input(a.c_attn);
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
  const k::AttentionShape shape = packed_qkv_shape(B, T, heads_, head_dim_);
  if (ctx.context != nullptr) {
    // Context parallelism: fp32 gradients summed over the ranks' queries, then rounded once with
    // c_attn's bias gradient (their column sums), as the one-rank kernel does in one pass.
    const Tensor wide = widened_qkv(ctx, a.qkv16, rows, 3 * A_);
    Tensor d_wide({rows, 3 * A_}, DType::f32, ctx.tracker, MemoryCategory::activations);
    const float* qkv = wide.f32();
    float* d = d_wide.f32();
    ctx.context->backward(ctx.ops, d, d + A_, d + 2 * A_, d_att, qkv, qkv + A_, qkv + 2 * A_,
                          a.att.f32(), a.lse.f32(), shape, k::Precision::bf16);
    ctx.ops.round_with_column_sums(d_qkv16, c_attn_.bias_grad(), d, rows, 3 * A_);
  } else {
    // c_attn's bias gradient comes out of the attention backward (the column sums of the
    // unrounded d q, k, v, in an order fixed by the shape).
    ctx.ops.attention_backward_bf16(d_qkv16, d_qkv16 + A_, d_qkv16 + 2 * A_, c_attn_.bias_grad(),
                                    d_att, qkv16, qkv16 + A_, qkv16 + 2 * A_, a.att.f32(),
                                    a.lse.f32(), shape, {});
  }
  if (input_half_only)
    c_attn_.backward_input_rounded(ctx, d_ln, d_qkv16, rows);
  else
    c_attn_.backward_rounded(ctx, a.c_attn, d_ln, d_qkv16, nullptr, rows);
}

void Gpt2Block::mlp_backward_bf16(const LayerContext& ctx, Saved& a, float* d_ln, const float* d_y,
                                  float* d_fc_buffer, float* d_y_buffer, int64_t rows, bool defer,
                                  bool fc_input_half_only) {
  // c_proj's d_out rounded once (with its bias gradient) for its weight gradient and for d_gelu.
  auto* d_y16 = reinterpret_cast<lattice::bf16*>(d_y_buffer);
  ctx.ops.round_with_column_sums(d_y16, mlp_proj_.bias_grad(), d_y, rows, C_);
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
