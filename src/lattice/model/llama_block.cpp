// Llama transformer block: see llama_block.hpp.
#include "lattice/model/llama_block.hpp"

#include <initializer_list>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/model/context_parallel.hpp"
#include "lattice/model/kv_cache.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

LlamaBlock::LlamaBlock(ParameterStore& store, const ModelConfig& config, int64_t layer_index,
                       const TensorParallelGroup& tp, const k::RopeTable& rope,
                       const ExpertParallelGroup& ep)
    : store_(store),
      rope_(rope),
      tp_(tp),
      C_(config.d_model),
      heads_(config.n_heads / tp.size),
      kv_heads_(config.n_kv_heads / tp.size),
      head_dim_(config.head_dim()),
      layer_(layer_index),
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
  std::string mlp = p + "mlp.";
  int64_t dense_width = F;
  if (config.is_moe_layer(layer_index)) {
    // Tensor parallelism: the attention (and a shared expert) split as in a dense block; the
    // routed experts replicated over tp, each tp rank running them on all rows (under sequence
    // parallelism its norm output gathered first) and keeping its own rows' output.
    mlp = p + (config.moe_names == MoeNames::mixtral ? "block_sparse_moe." : "mlp.");
    moe_.emplace(store, mlp, C_, config.expert_ffn_hidden(), moe_settings(config), config.moe_names,
                 ep);
    balancing_ = moe_balancing(config);
    mlp += "shared_experts.";
    dense_width = config.moe_shared_experts * config.expert_ffn_hidden();
  }
  if (dense_width > 0) {
    gate_proj_ =
        Linear(store, mlp + "gate_proj", C_, dense_width, false, InitKind::normal, tp, column);
    up_proj_ = Linear(store, mlp + "up_proj", C_, dense_width, false, InitKind::normal, tp, column);
    down_proj_ = Linear(store, mlp + "down_proj", dense_width, C_, false, InitKind::normal_residual,
                        tp, row);
    F_ = gate_proj_.out_features();
  }
}

void LlamaBlockActivations::release() {
  for (Tensor* t : {&n1,   &rstd1, &q, &k,   &v,   &att, &lse,  &x2,     &n2,   &rstd2,
                    &gate, &up,    &h, &d_q, &d_k, &d_v, &d_x2, &d_gate, &d_up, &d_y})
    t->reset();
  for (LinearActivations* l :
       {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj})
    l->release();
  moe.release();
  weight_gradients_pending = false;
}

const float* LlamaBlock::moe_input(const LayerContext& ctx, const Saved& a, Tensor& all_rows,
                                   int64_t rows) {
  if (!tp_.sequence_parallel) return a.n2.f32();
  ensure_activation(all_rows, {rows, C_}, ctx.tracker);
  gather_sequence(tp_, all_rows.f32(), a.n2.f32(), rows, C_);
  return all_rows.f32();
}

bool LlamaBlock::update_choice_bias(const std::vector<int64_t>& load, double rate) {
  if (!moe_ || !moe_->settings().choice_bias) return false;
  moe_->update_choice_bias(load, rate);
  return true;
}

std::optional<MoeLayerStatistics> LlamaBlock::moe_statistics(const BlockActivations& saved) const {
  if (!moe_) return std::nullopt;
  const auto* a = dynamic_cast<const Saved*>(&saved);
  check(a != nullptr, "a block was handed another block type's activations (internal error)");
  MoeLayerStatistics s;
  s.layer = layer_;
  s.tokens = a->moe.dispatch.tokens;
  s.copies = s.tokens * moe_->settings().top_k;
  s.dropped = a->moe.dispatch.dropped;
  s.counts = a->moe.counts;
  s.aux_loss = a->moe_losses.aux;
  s.z_loss = a->moe_losses.z;
  return s;
}

std::unique_ptr<BlockActivations> LlamaBlock::make_activations() const {
  return std::make_unique<Saved>();
}

int64_t LlamaBlock::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // prepare_activations' fp32 tensors — n1, x2, n2 and the two rstd on this rank's sequence rows
  // (local); q, k, v, gate, up, h on all rows (att and lse below) — and, in bf16, each Linear's
  // kept bf16 input: n1 for q/k/v, att for o, n2 for gate/up, h for down. Under sequence
  // parallelism the gathered n1 and n2 are not kept (gathered again in backward).
  const int64_t rows = B * T, local = tp_.local_rows(rows), C = C_, F = F_;
  const int64_t kv = kv_heads_ * head_dim_;
  // A MoE layer adds its routing and experts' activations (MoeMlp::saved_bytes); its dense MLP
  // (F = 0 without shared experts) keeps no bf16 inputs when there is none.
  int64_t bytes =
      local * 4 * (3 * C + 2) + rows * 4 * (A_ + 2 * kv + 3 * F) + attention_output_bytes(B, T);
  if (precision == k::Precision::bf16)
    bytes += rows * 2 * (A_ + F) + (tp_.sequence_parallel ? 0 : rows * 2 * (F > 0 ? 5 : 3) * C);
  if (moe_) bytes += moe_->saved_bytes(rows);
  return bytes;
}

int64_t LlamaBlock::attention_output_bytes(int64_t B, int64_t T) const {
  return B * T * A_ * 4 + B * heads_ * T * 4;  // att [rows, A] and lse [B, Hq, T], fp32
}

int64_t LlamaBlock::scratch_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // backward_pass's scratch slots: d_h, d_gate, d_up [rows, F]; d_part [rows, C], d_norm and d_x2
  // [local, C]; d_att, d_q [rows, A]; d_k, d_v [rows, kv]. Sequence parallelism adds the gathered
  // d_y (then d_x2, in the same slot), the column layers' partial d_norm over all rows and their
  // input gathered again
  // ([rows, C] each), and the norm weight's partial gradient.
  (void)precision;
  const int64_t rows = B * T, local = tp_.local_rows(rows), kv = kv_heads_ * head_dim_;
  // A MoE layer with shared experts adds the routed experts' input gradient [rows, C].
  int64_t floats = rows * (3 * F_ + C_ + 2 * A_ + 2 * kv) + 2 * local * C_;
  if (tp_.sequence_parallel) floats += 3 * rows * C_ + C_;
  if (moe_ && (F_ > 0 || tp_.sequence_parallel)) floats += rows * C_;
  return 4 * floats;
}

int64_t LlamaBlock::transient_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // Sequence parallelism: the MLP forward's is the largest — the partial sums before the
  // reduce-scatter and RMSNorm 2's gathered output (fp32 [rows, C] each), and in bf16 gate's and
  // up's roundings of it (freed after their GEMMs; q, k and v's three with one fp32 buffer are
  // less). A deferred weight half gathers both norms' outputs (fp32, as much).
  // A MoE layer: the backward's own buffers (MoeMlp::transient_bytes) and, with shared experts,
  // the routed output before it is added (fp32 [rows, C]); no sequence parallelism there.
  const int64_t rows = B * T;
  // Under sequence parallelism also its input gathered.
  if (moe_)
    return moe_->transient_bytes(rows) +
           4 * rows * C_ *
               ((F_ > 0 || tp_.sequence_parallel ? 1 : 0) + (tp_.sequence_parallel ? 1 : 0));
  if (!tp_.sequence_parallel) return 0;
  return rows * C_ * (8 + (precision == k::Precision::bf16 ? 4 : 0));
}

int64_t LlamaBlock::pending_weight_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // What backward_input keeps (its `kept` operands): gate's and up's output gradients, down's
  // (its own copy; none without a dense MLP), o's (over all rows) and q's, k's and v's.
  (void)precision;
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  return 4 * rows * (2 * F_ + (F_ > 0 ? 2 : 1) * C_ + A_ + 2 * kv);
}

void LlamaBlock::prepare_activations(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const int64_t rows = B * T, local = tp_.local_rows(rows), kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  ensure_activation(a.n1, {local, C_}, tr);
  ensure_activation(a.rstd1, {local}, tr);
  ensure_activation(a.q, {rows, A_}, tr);
  ensure_activation(a.k, {rows, kv}, tr);
  ensure_activation(a.v, {rows, kv}, tr);
  ensure_activation(a.att, {rows, A_}, tr);
  ensure_activation(a.lse, {B, heads_, T}, tr);
  ensure_activation(a.x2, {local, C_}, tr);
  ensure_activation(a.n2, {local, C_}, tr);
  ensure_activation(a.rstd2, {local}, tr);
  if (F_ > 0) {  // the dense MLP (a MoE layer: its shared experts, if any)
    ensure_activation(a.gate, {rows, F_}, tr);
    ensure_activation(a.up, {rows, F_}, tr);
    ensure_activation(a.h, {rows, F_}, tr);
  }
}

const float* LlamaBlock::norm_rows(const Tensor& norm, float* gathered, int64_t rows,
                                   TpCollective* pending) {
  if (!tp_.sequence_parallel) return norm.f32();
  if (pending == nullptr) {
    gather_sequence(tp_, gathered, norm.f32(), rows, C_);
  } else {
    *pending = TpCollective::gather(tp_, gathered, norm.f32(), rows, C_);
    if (!tp_.overlap) pending->wait();  // measuring what the overlap hides: blocking
  }
  return gathered;
}

void LlamaBlock::column_inputs_forward(const LayerContext& ctx, TpCollective& gather,
                                       const float* own_rows, const float* all_rows, int64_t rows,
                                       std::initializer_list<ColumnLayer> layers) {
  column_parallel_forward(
      tp_, gather,
      [&](int64_t first, int64_t count, bool own) {
        for (const ColumnLayer& l : layers) {
          if (own)
            l.layer->forward_piece(ctx, *l.saved, l.out + first * l.layer->out_features(), own_rows,
                                   rows, first, count);
          else
            l.layer->forward_rows(ctx, *l.saved, l.out, all_rows, rows, first, count);
        }
      },
      rows);
}

void LlamaBlock::qkv_forward(const LayerContext& ctx, Saved& a, const float* x_in, int64_t rows) {
  const bool sp = tp_.sequence_parallel;
  ctx.ops.rmsnorm_forward(a.n1.f32(), a.rstd1.f32(), x_in, store_.value(norm1_weight_),
                          tp_.local_rows(rows), C_, eps_);
  Tensor gathered;  // sequence parallelism: RMSNorm 1's output over all rows, for the GEMMs
  if (sp) ensure_activation(gathered, {rows, C_}, ctx.tracker);
  TpCollective gather = TpCollective::none(tp_);
  const float* n1 = norm_rows(a.n1, gathered.empty() ? nullptr : gathered.f32(), rows, &gather);
  column_inputs_forward(ctx, gather, a.n1.f32(), n1, rows,
                        {{&q_proj_, &a.q_proj, a.q.f32()},
                         {&k_proj_, &a.k_proj, a.k.f32()},
                         {&v_proj_, &a.v_proj, a.v.f32()}});
  // Sequence parallelism keeps this rank's rows (n1), not the gathered input or its bf16
  // rounding: backward gathers and rounds it again (the same bits).
  if (sp)
    for (LinearActivations* l : {&a.q_proj, &a.k_proj, &a.v_proj}) l->release();
}

void LlamaBlock::attention_core(const LayerContext& ctx, Saved& a, int64_t B, int64_t T) {
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  if (ctx.context != nullptr)
    ctx.context->forward(ctx.ops, a.att.f32(), a.lse.f32(), a.q.f32(), a.k.f32(), a.v.f32(), shape,
                         ctx.precision);
  else
    ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), a.q.f32(), a.k.f32(), a.v.f32(), shape,
                              ctx.precision, {});
}

void LlamaBlock::projection_and_mlp_forward(const LayerContext& ctx, Saved& a, float* x_out,
                                            const float* x_in, int64_t rows) {
  const int64_t local = tp_.local_rows(rows);
  const bool sp = tp_.sequence_parallel;
  // The row-parallel projections' partial sums over all rows, reduced over tp: all-reduced in
  // place, or reduce-scattered onto this rank's rows from `partial` under sequence parallelism.
  Tensor partial, gathered;
  if (sp) {
    ensure_activation(partial, {rows, C_}, ctx.tracker);
    ensure_activation(gathered, {rows, C_}, ctx.tracker);
  }
  float* attn_out = sp ? partial.f32() : a.x2.f32();
  row_parallel_forward(
      tp_,
      [&](int64_t first, int64_t count) {
        o_proj_.forward_rows(ctx, a.o_proj, attn_out, a.att.f32(), rows, first, count);
      },
      a.x2.f32(), attn_out, rows, C_);
  ctx.ops.add_inplace(a.x2.f32(), x_in, local * C_);
  ctx.ops.rmsnorm_forward(a.n2.f32(), a.rstd2.f32(), a.x2.f32(), store_.value(norm2_weight_), local,
                          C_, eps_);
  if (F_ > 0) {  // the dense SwiGLU (a MoE layer's shared experts)
    TpCollective gather = TpCollective::none(tp_);
    const float* n2 = norm_rows(a.n2, sp ? gathered.f32() : nullptr, rows, &gather);
    column_inputs_forward(
        ctx, gather, a.n2.f32(), n2, rows,
        {{&gate_proj_, &a.gate_proj, a.gate.f32()}, {&up_proj_, &a.up_proj, a.up.f32()}});
    if (sp)
      for (LinearActivations* l : {&a.gate_proj, &a.up_proj}) l->release();
    gathered.reset();
    ctx.ops.swiglu_forward(a.h.f32(), a.gate.f32(), a.up.f32(), rows * F_);
    float* mlp_out = sp ? partial.f32() : x_out;
    row_parallel_forward(
        tp_,
        [&](int64_t first, int64_t count) {
          down_proj_.forward_rows(ctx, a.down_proj, mlp_out, a.h.f32(), rows, first, count);
        },
        x_out, mlp_out, rows, C_);
  }
  if (moe_) {  // the routed experts, on all rows (replicated over tp)
    Tensor all_rows, routed;
    const float* moe_in = moe_input(ctx, a, all_rows, rows);
    const bool separate = F_ > 0 || sp;  // added to the shared experts', or this rank's rows kept
    if (separate) ensure_activation(routed, {rows, C_}, ctx.tracker);
    float* out = separate ? routed.f32() : x_out;
    moe_->forward(ctx, a.moe, out, moe_in, rows);
    const float* own = out + (sp ? tp_.rank * local * C_ : 0);
    if (F_ > 0)
      ctx.ops.add_inplace(x_out, own, local * C_);
    else if (sp)
      ctx.ops.copy(x_out, own, local * C_);
    // Training: the experts' loads over the balancing group (one small all-reduce per layer).
    comm::Communicator* group = ctx.balancing;
    if (group != nullptr && group->size() > 1 && a.loss_scale != 0.0f &&
        balancing_.aux_coefficient != 0) {
      std::vector<int64_t> load = a.moe.counts;
      group->allreduce(load.data(), static_cast<int64_t>(load.size()), DType::i64,
                       comm::ReduceOp::sum);
      a.moe_losses = moe_balancing_losses(a.moe, rows, moe_->settings(), balancing_, a.loss_scale,
                                          &load, group->size());
    } else {
      a.moe_losses = moe_balancing_losses(a.moe, rows, moe_->settings(), balancing_, a.loss_scale);
    }
  }
  ctx.ops.add_inplace(x_out, a.x2.f32(), local * C_);
}

void LlamaBlock::forward(const LayerContext& ctx, BlockActivations& saved, float* x_out,
                         const float* x_in, int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T, kv = kv_heads_ * head_dim_;
  prepare_activations(ctx, a, B, T);
  qkv_forward(ctx, a, x_in, rows);
  rope_at_runs(ctx.ops, ctx.context, rope_, a.q.f32(), B, T, heads_, A_, T * A_, false);
  rope_at_runs(ctx.ops, ctx.context, rope_, a.k.f32(), B, T, kv_heads_, kv, T * kv, false);
  attention_core(ctx, a, B, T);
  projection_and_mlp_forward(ctx, a, x_out, x_in, rows);
  drop_recomputed_attention(a, a.att, a.lse);  // selective checkpointing: recomputed in backward
}

void LlamaBlock::backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                               const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                               BackwardScratch& scratch, bool defer) {
  Saved& a = saved_as<Saved>(saved);
  const int64_t rows = B * T, local = tp_.local_rows(rows), kv = kv_heads_ * head_dim_;
  auto* tr = ctx.tracker;
  const bool sp = tp_.sequence_parallel;
  if (a.recompute_attention && a.att.empty()) {  // selective checkpointing: the attention again
    ensure_activation(a.att, {rows, A_}, tr);
    ensure_activation(a.lse, {B, heads_, T}, tr);
    attention_core(ctx, a, B, T);
    // o_proj's bf16 input was rounded from these same values: it stays valid.
    if (a.o_proj.rounded_from != nullptr) a.o_proj.rounded_from = a.att.f32();
  }
  // The gradients each Linear's weight half reads: scratch when it runs here, kept in `a` when
  // backward_weight runs it later. d_x_out, d_x_in, d_norm and d_x2 hold this rank's rows
  // (local); the rest all rows.
  auto kept = [&](Tensor& pending, int slot, int64_t numel) {
    return weight_gradient_operand(defer, pending, scratch, slot, numel, tr);
  };
  const bool dense = F_ > 0;  // a dense MLP (a MoE layer: its shared experts)
  float* d_h = dense ? scratch.get(0, rows * F_, tr) : nullptr;
  float* d_gate = dense ? kept(a.d_gate, 1, rows * F_) : nullptr;
  float* d_up = dense ? kept(a.d_up, 2, rows * F_) : nullptr;
  float* d_norm = scratch.get(3, local * C_, tr);
  float* d_part = scratch.get(4, rows * C_, tr);
  float* d_x2 = sp ? scratch.get(5, local * C_, tr) : kept(a.d_x2, 5, rows * C_);
  float* d_att = scratch.get(6, rows * A_, tr);
  float* d_q = kept(a.d_q, 7, rows * A_);
  float* d_k = kept(a.d_k, 8, rows * kv);
  float* d_v = kept(a.d_v, 9, rows * kv);
  // Sequence parallelism: the row-parallel layers' output gradients over all rows (gathered), the
  // column-parallel layers' partial input gradient over all rows (before its reduce-scatter onto
  // d_norm), their input gathered again, the norm's partial weight gradient. Without it these are
  // d_x_out, d_x2, d_norm and the saved norm outputs.
  const float* d_y = d_x_out;
  if (sp) {
    float* gathered = kept(a.d_y, 10, rows * C_);
    gather_sequence(tp_, gathered, d_x_out, rows, C_);
    d_y = gathered;
  } else if (defer && dense) {  // d_x_out may be overwritten by d_x_in: down_proj's W keeps a copy
    float* copy = kept(a.d_y, 10, rows * C_);
    ctx.ops.copy(copy, d_x_out, rows * C_);
    d_y = copy;
  }
  float* d_norm_rows = sp ? scratch.get(11, rows * C_, tr) : d_norm;
  float* gathered_input = sp ? scratch.get(12, rows * C_, tr) : nullptr;
  float* norm_grad = sp ? scratch.get(13, C_, tr) : nullptr;
  // A Linear's backward: both halves now, or the input half with the weight half left for later.
  auto linear_backward = [&](Linear& layer, LinearActivations& saved, float* d_in,
                             const float* d_out, const float* in) {
    if (defer)
      layer.backward_input(ctx, saved, d_in, d_out, rows);
    else
      layer.backward(ctx, saved, d_in, d_out, in, rows);
  };
  // With tensor parallelism the column-parallel layers run their halves apart: the input halves
  // into d_norm_rows, then their summed partial gradient reduced onto d_norm (all-reduce, or
  // reduce-scatter under sequence parallelism) while the weight halves run
  // (TensorParallelGroup::overlap; without it, or when the weight halves are deferred, the
  // reduction blocks). Under sequence parallelism their input is gathered again first, while the
  // input halves run.
  const bool split = defer || tp_.size > 1;
  auto column_input_half = [&](Linear& layer, LinearActivations& saved, float* d_in,
                               const float* d_out, const float* in) {
    if (split)
      layer.backward_input(ctx, saved, d_in, d_out, rows);
    else
      layer.backward(ctx, saved, d_in, d_out, in, rows);
  };
  struct WeightHalf {
    Linear* layer;
    LinearActivations* saved;
    const float* d_out;
  };
  auto finish_column = [&](TpCollective& input_gather, const float* in,
                           std::initializer_list<WeightHalf> weight_halves) {
    if (!split) return;
    TpCollective reduction = TpCollective::reduce(tp_, d_norm, d_norm_rows, rows, C_);
    if (!tp_.overlap) reduction.wait();
    if (!defer) {
      input_gather.wait();
      for (const WeightHalf& w : weight_halves)
        w.layer->backward_weight(ctx, *w.saved, w.d_out, in, rows);
    }
    reduction.wait();
  };
  auto norm_backward = [&](float* d_in, int weight, const float* x, const Tensor& rstd,
                           const float* residual_grad) {
    ReplicatedGradients grads(tp_, ctx.ops, {store_.grad(weight)}, C_, norm_grad);
    ctx.ops.rmsnorm_backward(d_in, grads.target(0), d_norm, x, store_.value(weight), rstd.f32(),
                             local, C_, residual_grad);
    grads.finish();
  };

  // MLP branch: x_out = x2 + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(x2); a MoE layer adds
  // (or, without shared experts, has only) its routed experts' output.
  if (dense) {
    TpCollective n2_gather = TpCollective::none(tp_);
    const float* n2 = defer ? nullptr : norm_rows(a.n2, gathered_input, rows, &n2_gather);
    linear_backward(down_proj_, a.down_proj, d_h, d_y, a.h.f32());
    ctx.ops.swiglu_backward(d_gate, d_up, d_h, a.gate.f32(), a.up.f32(), rows * F_);
    column_input_half(gate_proj_, a.gate_proj, d_norm_rows, d_gate, n2);
    column_input_half(up_proj_, a.up_proj, d_part, d_up, n2);
    ctx.ops.add_inplace(d_norm_rows, d_part, rows * C_);
    finish_column(n2_gather, n2,
                  {{&gate_proj_, &a.gate_proj, d_gate}, {&up_proj_, &a.up_proj, d_up}});
  }
  if (moe_) {         // the routed experts' whole backward, weights included, in either half
    Tensor all_rows;  // sequence parallelism: the norm output over all rows again
    const float* moe_in = moe_input(ctx, a, all_rows, rows);
    const bool separate = dense || sp;
    float* d_routed = separate ? scratch.get(14, rows * C_, tr) : d_norm;
    moe_->backward(ctx, a.moe, d_routed, d_y, moe_in, rows, a.moe_losses.gradients());
    const float* own = d_routed + (sp ? tp_.rank * local * C_ : 0);
    if (dense)
      ctx.ops.add_inplace(d_norm, own, local * C_);
    else if (sp)
      ctx.ops.copy(d_norm, own, local * C_);
  }
  norm_backward(d_x2, norm2_weight_, a.x2.f32(), a.rstd2, d_x_out);

  // Attention branch: x2 = x_in + o(attention(rope(q(n1)), rope(k(n1)), v(n1))).
  float* d_x2_rows = d_x2;  // the row-parallel o_proj's d_out over all rows
  if (sp) {
    d_x2_rows = kept(a.d_x2, 10, rows * C_);  // d_y's slot: the MLP branch is done with it
    gather_sequence(tp_, d_x2_rows, d_x2, rows, C_);
  }
  TpCollective n1_gather = TpCollective::none(tp_);
  const float* n1 = defer ? nullptr : norm_rows(a.n1, gathered_input, rows, &n1_gather);
  linear_backward(o_proj_, a.o_proj, d_att, d_x2_rows, a.att.f32());
  const auto shape = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  if (ctx.context != nullptr)
    ctx.context->backward(ctx.ops, d_q, d_k, d_v, d_att, a.q.f32(), a.k.f32(), a.v.f32(),
                          a.att.f32(), a.lse.f32(), shape, ctx.precision);
  else
    ctx.ops.attention_backward(d_q, d_k, d_v, d_att, a.q.f32(), a.k.f32(), a.v.f32(), a.att.f32(),
                               a.lse.f32(), shape, ctx.precision, {});
  rope_at_runs(ctx.ops, ctx.context, rope_, d_q, B, T, heads_, A_, T * A_, true);
  rope_at_runs(ctx.ops, ctx.context, rope_, d_k, B, T, kv_heads_, kv, T * kv, true);
  column_input_half(q_proj_, a.q_proj, d_norm_rows, d_q, n1);
  column_input_half(k_proj_, a.k_proj, d_part, d_k, n1);
  ctx.ops.add_inplace(d_norm_rows, d_part, rows * C_);
  column_input_half(v_proj_, a.v_proj, d_part, d_v, n1);
  ctx.ops.add_inplace(d_norm_rows, d_part, rows * C_);
  finish_column(
      n1_gather, n1,
      {{&q_proj_, &a.q_proj, d_q}, {&k_proj_, &a.k_proj, d_k}, {&v_proj_, &a.v_proj, d_v}});
  norm_backward(d_x_in, norm1_weight_, x_in, a.rstd1, d_x2);
  if (!defer) drop_recomputed_attention(a, a.att, a.lse);
}

void LlamaBlock::weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                             int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  (void)x_in;
  const int64_t rows = B * T;
  // The column layers' inputs over all rows: gathered again under sequence parallelism.
  Tensor gathered;
  if (tp_.sequence_parallel) ensure_activation(gathered, {2 * rows, C_}, ctx.tracker);
  float* buffer = gathered.empty() ? nullptr : gathered.f32();
  const float* n2 = norm_rows(a.n2, buffer, rows, nullptr);
  const float* n1 =
      norm_rows(a.n1, buffer == nullptr ? nullptr : buffer + rows * C_, rows, nullptr);
  if (F_ > 0) {  // a MoE layer's routed experts ran their weight gradients in backward_input
    down_proj_.backward_weight(ctx, a.down_proj, a.d_y.f32(), a.h.f32(), rows);
    gate_proj_.backward_weight(ctx, a.gate_proj, a.d_gate.f32(), n2, rows);
    up_proj_.backward_weight(ctx, a.up_proj, a.d_up.f32(), n2, rows);
  }
  o_proj_.backward_weight(ctx, a.o_proj, a.d_x2.f32(), a.att.f32(), rows);
  q_proj_.backward_weight(ctx, a.q_proj, a.d_q.f32(), n1, rows);
  k_proj_.backward_weight(ctx, a.k_proj, a.d_k.f32(), n1, rows);
  v_proj_.backward_weight(ctx, a.v_proj, a.d_v.f32(), n1, rows);
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
