// LmHead: see lm_head.hpp.
#include "lattice/model/lm_head.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/block.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

LmHead::LmHead(ParameterStore& store, const ModelConfig& config, int tied_weight,
               const std::string& untied_copy_of, const TensorParallelGroup& tp)
    : store_(store),
      tp_(tp),
      layout_(tp),
      family_(config.family),
      C_(config.d_model),
      V_(config.vocab_size),
      eps_(config.norm_eps) {
  const bool gpt2 = family_ == Family::gpt2;
  norm_weight_ = store.declare(gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", {C_},
                               InitKind::ones, false);
  if (gpt2) norm_bias_ = store.declare("transformer.ln_f.bias", {C_}, InitKind::zeros, false);
  const int64_t vocab = config.vocab_size;
  if (tied_weight >= 0) {
    weight_ = tied_weight;  // the embedding's table, or its tensor-parallel slice
  } else if (tp.size == 1) {
    weight_ = store.declare("lm_head.weight", {vocab, C_}, InitKind::normal, true, untied_copy_of);
  } else {
    const TensorShard shard{0, tp.rank, tp.size, 1, config.padded_vocab_size(tp.size)};
    weight_ = store.declare_shard("lm_head.weight", {vocab, C_}, shard,
                                  mesh::AxisSet::all().without(mesh::Axis::tp), InitKind::normal,
                                  true, untied_copy_of);
  }
  // This rank's rows of the (padded) vocabulary and the real ones among them.
  V_ = store.info(weight_).shape[0];
  if (tp.size > 1) slice_ = config.vocab_slice(tp.rank, tp.size);
}

int64_t LmHead::saved_bytes(kernels::Precision precision, int64_t rows,
                            const kernels::Ops& ops) const {
  // What forward_loss and backward allocate in HeadActivations for `rows` training rows.
  const int64_t local = tp_.local_rows(rows);
  const int64_t stats = (norm_bias_ >= 0 ? 2 : 1) * local * 4;  // LayerNorm: mean and rstd
  const int64_t d_normed = rows * C_ * 4;                       // backward (or the fused forward)
  // fp32, and every tensor-parallel head: the normed input and this rank's logits [rows, V_]
  // (bf16: and the rounded input); under sequence parallelism the norm's output gradient on this
  // rank's rows too.
  if (precision != k::Precision::bf16 || tp_.size > 1)
    return rows * C_ * 4 + stats + rows * V_ * 4 + d_normed +
           (precision == k::Precision::bf16 ? rows * C_ * 2 : 0) +
           (tp_.sequence_parallel ? local * C_ * 4 : 0);
  // bf16: the rounded input (the norm writes it directly); then either the fused head's per-lane
  // weight-gradient partials or the rounded logits gradient.
  const int64_t input = rows * C_ * 2 + stats;
  const k::HeadLossPlan plan = ops.plan_head_loss_bf16(rows, C_, V_, true, fusion_);
  const int64_t gradient = plan.backward_in_forward
                               ? int64_t{plan.weight_gradient_partials} * V_ * C_ * 4
                               : rows * V_ * 2;
  return input + gradient + d_normed;
}

double LmHead::forward_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                            const int32_t* targets, int64_t rows, float grad_scale,
                            MemoryTracker* tracker) {
  if (tp_.size > 1) return vocab_parallel_loss(ctx, h, x, targets, rows, grad_scale, tracker);
  if (ctx.precision == k::Precision::bf16) {
    const double loss_sum = loss_in_row_chunks(ctx, h, x, targets, rows, grad_scale, tracker);
    h.logits_grad_bf16 = grad_scale != 0.0f;
    return loss_sum;
  }
  logits(ctx, h, x, rows, tracker);
  h.logits_grad_bf16 = false;
  h.backward_in_forward = false;
  if (grad_scale != 0.0f)
    return ctx.ops.cross_entropy_forward_backward(h.logits.f32(), h.logits.f32(), targets, rows, V_,
                                                  grad_scale);
  return ctx.ops.cross_entropy_forward(h.logits.f32(), targets, rows, V_);
}

void LmHead::norm_forward(const LayerContext& ctx, HeadActivations& h, const float* x, int64_t rows,
                          MemoryTracker* tracker) {
  // Under sequence parallelism x holds this rank's rows: the norm runs on them and its output is
  // gathered into normed, all rows, which the vocabulary-parallel GEMM reads.
  const int64_t C = C_, local = tp_.local_rows(rows);
  const bool sp = tp_.sequence_parallel;
  Tensor local_out;  // sequence parallelism: this rank's rows, freed once gathered
  Tensor& out = sp ? local_out : h.normed;
  ensure_activation(out, {local, C}, ctx.ops.memory(), tracker);
  ensure_activation(h.norm_rstd, {local}, ctx.ops.memory(), tracker);
  if (family_ == Family::gpt2) {
    ensure_activation(h.norm_mean, {local}, ctx.ops.memory(), tracker);
    ctx.ops.layernorm_forward(out.f32(), h.norm_mean.f32(), h.norm_rstd.f32(), x,
                              store_.value(norm_weight_), store_.value(norm_bias_), local, C, eps_);
  } else {
    ctx.ops.rmsnorm_forward(out.f32(), h.norm_rstd.f32(), x, store_.value(norm_weight_), local, C,
                            eps_);
  }
  if (!sp) return;
  ensure_activation(h.normed, {rows, C}, ctx.ops.memory(), tracker);
  layout_.gather(h.normed.f32(), out.f32(), rows, C);
}

double LmHead::loss_in_row_chunks(const LayerContext& ctx, HeadActivations& h, const float* x,
                                  const int32_t* targets, int64_t rows, float grad_scale,
                                  MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  ensure_bf16_activation(h.normed16, {rows, C}, ctx.ops.memory(),
                         tracker);  // kept for the weight gradient
  // The norm writes the GEMM's bf16 input directly (no fp32 output).
  ensure_activation(h.norm_rstd, {rows}, ctx.ops.memory(), tracker);
  h.normed.reset();
  if (family_ == Family::gpt2) {
    ensure_activation(h.norm_mean, {rows}, ctx.ops.memory(), tracker);
    ctx.ops.layernorm_forward_bf16(h.normed16.data<lattice::bf16>(), h.norm_mean.f32(),
                                   h.norm_rstd.f32(), x, store_.value(norm_weight_),
                                   store_.value(norm_bias_), rows, C, eps_);
  } else {
    ctx.ops.rmsnorm_forward_bf16(h.normed16.data<lattice::bf16>(), h.norm_rstd.f32(), x,
                                 store_.value(norm_weight_), rows, C, eps_);
  }
  h.logits.reset();  // the whole [rows, V] logits never exist here
  const k::HeadLossPlan plan = ctx.ops.plan_head_loss_bf16(rows, C, V, grad_scale != 0.0f, fusion_);
  h.backward_in_forward = plan.backward_in_forward;
  float* d_normed = nullptr;
  float* partials = nullptr;
  lattice::bf16* d_logits16 = nullptr;
  if (h.backward_in_forward) {
    // The head's backward runs inside the forward: d_normed and the weight gradient's partials
    // (added to the parameter gradient by backward) come out while the logits' gradient is in
    // cache, and that gradient is never stored.
    h.d_logits16.reset();
    ensure_activation(h.d_normed, {rows, C}, ctx.ops.memory(), tracker);
    ensure_activation(h.grad_partials, {plan.weight_gradient_partials, V, C}, ctx.ops.memory(),
                      tracker);
    d_normed = h.d_normed.f32();
    partials = h.grad_partials.f32();
  } else {
    h.grad_partials.reset();
    if (grad_scale != 0.0f) {
      ensure_bf16_activation(h.d_logits16, {rows, V}, ctx.ops.memory(), tracker);
      d_logits16 = h.d_logits16.data<lattice::bf16>();
    }
  }
  // The head weight with the store's bf16 copy (when it keeps one): this path is bf16 only.
  const k::WeightOperand head_weight{store_.value(weight_), store_.bf16_value(weight_)};
  return ctx.ops.head_loss_bf16(plan, h.normed16.data<lattice::bf16>(), head_weight, rows, C, V,
                                targets, grad_scale, d_normed, partials, d_logits16);
}

const float* LmHead::logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                            int64_t rows, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  norm_forward(ctx, h, x, rows, tracker);
  ensure_activation(h.logits, {rows, V}, ctx.ops.memory(), tracker);
  k::Bf16Operands keep;  // bf16: the rounded normed is kept for the weight gradient
  if (ctx.precision == k::Precision::bf16) {
    ensure_bf16_activation(h.normed16, {rows, C}, ctx.ops.memory(), tracker);
    keep.in = h.normed16.data<lattice::bf16>();
    keep.weight = store_.bf16_value(weight_);
  }
  ctx.ops.linear_forward(h.logits.f32(), h.normed.f32(), store_.value(weight_), nullptr, rows, C, V,
                         ctx.precision, keep);
  return h.logits.f32();
}

void LmHead::backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                      int64_t rows, BackwardPart part, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  if (h.backward_in_forward) {  // d_normed is there; the weight gradient is in lanes
    if (part != BackwardPart::input) {
      const int64_t lanes = h.grad_partials.shape()[0];
      ctx.ops.add_partials(store_.grad(weight_), h.grad_partials.f32(), lanes, V * C, V * C);
    }
  } else {
    backward_gemm(ctx, h, rows, part, tracker);
  }
  if (part != BackwardPart::weight) norm_backward(ctx, h, d_x, x, rows);
}

double LmHead::vocab_parallel_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                                   const int32_t* targets, int64_t rows, float grad_scale,
                                   MemoryTracker* tracker) {
  // This rank's logits [rows, V_] of its vocabulary slice (the whole row exists on no rank); the
  // rows' max, then their sums of exponentials and target logits, reduced over tp between the
  // three passes (Megatron's vocabulary-parallel cross-entropy). The gradient replaces the logits.
  logits(ctx, h, x, rows, tracker);
  h.logits_grad_bf16 = false;
  h.backward_in_forward = false;
  const int64_t valid = slice_.end - slice_.begin;
  // 12 bytes a row for the three passes, freed at once (not counted as activations).
  Tensor stats({3, rows}, DType::f32, ctx.ops.memory());
  float* row_max = stats.f32();
  float* sums = row_max + rows;  // [row_sum | target_logit]
  ctx.ops.vocab_slice_row_max(row_max, h.logits.f32(), rows, V_, valid);
  layout_.all_reduce(row_max, rows, comm::ReduceOp::max);
  ctx.ops.vocab_slice_row_sums(sums, sums + rows, h.logits.f32(), row_max, targets, rows, V_, valid,
                               slice_);
  layout_.all_reduce(sums, 2 * rows);
  return ctx.ops.vocab_slice_loss(grad_scale != 0.0f ? h.logits.f32() : nullptr, h.logits.f32(),
                                  row_max, sums, sums + rows, targets, rows, V_, valid, slice_,
                                  grad_scale);
}

void LmHead::backward_gemm(const LayerContext& ctx, HeadActivations& h, int64_t rows,
                           BackwardPart part, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  if (part != BackwardPart::weight)
    ensure_activation(h.d_normed, {rows, C}, ctx.ops.memory(), tracker);
  k::Bf16Operands rounded;  // bf16: the gradient and input rounded in forward_stage / head_forward
  const float* d_logits = h.logits.f32();
  if (ctx.precision == k::Precision::bf16 && h.logits_grad_bf16 &&
      h.normed16.shape() == Shape{rows, C}) {
    rounded.d_out = h.d_logits16.data<lattice::bf16>();
    rounded.in = h.normed16.data<lattice::bf16>();
    rounded.weight = store_.bf16_value(weight_);
    d_logits = nullptr;
  }
  float* d_in = part != BackwardPart::weight ? h.d_normed.f32() : nullptr;
  float* d_weight = part != BackwardPart::input ? store_.grad(weight_) : nullptr;
  ctx.ops.linear_backward(d_in, d_weight, nullptr, d_logits, h.normed.f32(), store_.value(weight_),
                          rows, C, V, ctx.precision, rounded);
  // The vocabulary slices' partial input gradients, summed over tp (a column-parallel layer's):
  // in place, or onto this rank's sequence rows under sequence parallelism.
  if (d_in == nullptr) return;
  if (tp_.sequence_parallel)
    ensure_activation(h.d_normed_local, {tp_.local_rows(rows), C}, ctx.ops.memory(), tracker);
  layout_.reduce(tp_.sequence_parallel ? h.d_normed_local.f32() : d_in, d_in, rows, C);
}

void LmHead::norm_backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                           int64_t rows) {
  // Under sequence parallelism on this rank's rows, the norm's weight gradients partial sums
  // over tp (ReplicatedGradients).
  const int64_t C = C_, local = tp_.local_rows(rows);
  const float* d_out = tp_.sequence_parallel ? h.d_normed_local.f32() : h.d_normed.f32();
  Tensor partial;
  if (tp_.sequence_parallel) partial = Tensor({2 * C}, DType::f32, ctx.ops.memory());
  parallel::ReplicatedGradients grads(
      layout_, ctx.ops,
      {store_.grad(norm_weight_), norm_bias_ >= 0 ? store_.grad(norm_bias_) : nullptr}, C,
      partial.empty() ? nullptr : partial.f32());
  if (family_ == Family::gpt2) {
    ctx.ops.layernorm_backward(d_x, grads.target(0), grads.target(1), d_out, x,
                               store_.value(norm_weight_), h.norm_mean.f32(), h.norm_rstd.f32(),
                               local, C, nullptr);
  } else {
    ctx.ops.rmsnorm_backward(d_x, grads.target(0), d_out, x, store_.value(norm_weight_),
                             h.norm_rstd.f32(), local, C, nullptr);
  }
  grads.finish();
}

const float* LmHead::inference_logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                                      int64_t rows, MemoryTracker* tracker) {
  check(tp_.size == 1,
        "KV-cached generation runs on one rank: generate from the run's (logical) checkpoint");
  norm_forward(ctx, h, x, rows, tracker);
  ensure_activation(h.logits, {rows, V_}, ctx.ops.memory(), tracker);
  ctx.ops.linear_forward(h.logits.f32(), h.normed.f32(), store_.value(weight_), nullptr, rows, C_,
                         V_, ctx.precision, {});
  return h.logits.f32();
}

}  // namespace lattice::model
