// LmHead: see lm_head.hpp.
#include "lattice/model/lm_head.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/layernorm.hpp"
#include "lattice/kernels/cpu/rmsnorm.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"
#include "lattice/model/block.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

LmHead::LmHead(ParameterStore& store, const ModelConfig& config, int tied_weight,
               const std::string& untied_copy_of)
    : store_(store),
      family_(config.family),
      C_(config.d_model),
      V_(config.vocab_size),
      eps_(config.norm_eps) {
  const bool gpt2 = family_ == Family::gpt2;
  norm_weight_ = store.declare(gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", {C_},
                               InitKind::ones, false);
  if (gpt2) norm_bias_ = store.declare("transformer.ln_f.bias", {C_}, InitKind::zeros, false);
  weight_ = tied_weight >= 0
                ? tied_weight
                : store.declare("lm_head.weight", {V_, C_}, InitKind::normal, true, untied_copy_of);
}

LmHead::HeadPlan LmHead::plan_bf16(const k::MatmulEngine& engine, int64_t rows,
                                   bool with_gradient) const {
  HeadPlan plan;
  // Rows per chunk: each chunk's GEMM reads the whole head weight again (V·C bf16) and saves
  // writing and re-reading its rows' fp32 logits (8·V bytes per row), so chunks of at least C rows
  // re-read less than they save; 256 was fastest on the small bench shape (L4 d256 V8192: 64, 128,
  // 512 and 1024 rows were 2-8% slower); the chunks are split evenly between the threads.
  plan.chunk_rows = std::max<int64_t>(256, (C_ + 15) / 16 * 16);
  // The engine's choice: AMX on this CPU and its AMX kernels not turned off (MatmulOptions).
  plan.vocab_blocked = fusion_ != HeadFusion::always && engine.uses_vocab_blocked_head(C_);
  plan.lanes = plan.vocab_blocked ? k::MatmulEngine::vocab_blocked_lanes(rows)
                                  : k::MatmulEngine::gradient_lanes(rows, plan.chunk_rows);
  plan.backward_in_forward =
      with_gradient &&
      (fusion_ == HeadFusion::always || fusion_ == HeadFusion::vocab_blocked ||
       (fusion_ == HeadFusion::when_smaller && plan.lanes * V_ * C_ * 4 <= rows * V_ * 2));
  return plan;
}

int64_t LmHead::saved_bytes(kernels::Precision precision, int64_t rows,
                            const k::MatmulEngine& engine) const {
  // What forward_loss and backward allocate in HeadActivations for `rows` training rows.
  const int64_t stats = (norm_bias_ >= 0 ? 2 : 1) * rows * 4;  // LayerNorm: mean and rstd
  const int64_t d_normed = rows * C_ * 4;                      // backward (or the fused forward)
  if (precision != k::Precision::bf16) return rows * C_ * 4 + stats + rows * V_ * 4 + d_normed;
  // bf16: the rounded input; Llama's RMSNorm keeps its fp32 output too (GPT-2's LayerNorm writes
  // bf16 directly); then either the fused head's per-lane weight-gradient partials or the rounded
  // logits gradient.
  const int64_t input = rows * C_ * 2 + (norm_bias_ >= 0 ? 0 : rows * C_ * 4) + stats;
  const HeadPlan plan = plan_bf16(engine, rows, true);
  const int64_t gradient =
      plan.backward_in_forward ? int64_t{plan.lanes} * V_ * C_ * 4 : rows * V_ * 2;
  return input + gradient + d_normed;
}

double LmHead::forward_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                            const int32_t* targets, int64_t rows, float grad_scale,
                            MemoryTracker* tracker) {
  if (ctx.precision == k::Precision::bf16) {
    const double loss_sum = loss_in_row_chunks(ctx, h, x, targets, rows, grad_scale, tracker);
    h.logits_grad_bf16 = grad_scale != 0.0f;
    return loss_sum;
  }
  logits(ctx, h, x, rows, tracker);
  h.logits_grad_bf16 = false;
  h.backward_in_forward = false;
  if (grad_scale != 0.0f)
    return k::cross_entropy_forward_backward(h.logits.f32(), h.logits.f32(), targets, rows, V_,
                                             grad_scale);
  return k::cross_entropy_forward(h.logits.f32(), targets, rows, V_);
}

void LmHead::norm_forward(HeadActivations& h, const float* x, int64_t rows,
                          MemoryTracker* tracker) {
  const int64_t C = C_;
  ensure_activation(h.normed, {rows, C}, tracker);
  ensure_activation(h.norm_rstd, {rows}, tracker);
  if (family_ == Family::gpt2) {
    ensure_activation(h.norm_mean, {rows}, tracker);
    k::layernorm_forward(h.normed.f32(), h.norm_mean.f32(), h.norm_rstd.f32(), x,
                         store_.value(norm_weight_), store_.value(norm_bias_), rows, C, eps_);
  } else {
    k::rmsnorm_forward(h.normed.f32(), h.norm_rstd.f32(), x, store_.value(norm_weight_), rows, C,
                       eps_);
  }
}

double LmHead::loss_in_row_chunks(const LayerContext& ctx, HeadActivations& h, const float* x,
                                  const int32_t* targets, int64_t rows, float grad_scale,
                                  MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  ensure_bf16_activation(h.normed16, {rows, C}, tracker);  // kept for the weight gradient
  if (family_ == Family::gpt2) {  // the LayerNorm writes the GEMM's bf16 input directly
    ensure_activation(h.norm_mean, {rows}, tracker);
    ensure_activation(h.norm_rstd, {rows}, tracker);
    h.normed.reset();
    k::layernorm_forward_bf16(h.normed16.data<lattice::bf16>(), h.norm_mean.f32(),
                              h.norm_rstd.f32(), x, store_.value(norm_weight_),
                              store_.value(norm_bias_), rows, C, eps_);
  } else {
    norm_forward(h, x, rows, tracker);
    k::convert_to_bf16(h.normed16.data<lattice::bf16>(), h.normed.f32(), rows * C);
  }
  h.logits.reset();  // the whole [rows, V] logits never exist here
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
  std::vector<std::vector<float>> work(static_cast<size_t>(omp_get_max_threads()));
  auto row_work = [&]() -> float* {
    auto& row = work[static_cast<size_t>(omp_get_thread_num())];
    if (row.empty()) row.resize(static_cast<size_t>(V));
    return row.data();
  };
  const HeadPlan plan = plan_bf16(ctx.matmul, rows, grad_scale != 0.0f);
  const int64_t chunk_rows = plan.chunk_rows;
  const bool vocab_blocked = plan.vocab_blocked;
  const int lanes = plan.lanes;
  h.backward_in_forward = plan.backward_in_forward;
  // The head weight with the store's bf16 copy (when it keeps one): this path is bf16 only.
  const k::WeightOperand head_weight{store_.value(weight_), store_.bf16_value(weight_)};
  if (h.backward_in_forward && vocab_blocked) {
    // The head and its cross-entropy in blocks of the vocabulary: the logits are computed twice
    // and neither they nor their gradient leave the cache (MatmulEngine's
    // head_cross_entropy_vocab_blocked); d_normed and per-lane partials as below.
    h.d_logits16.reset();
    ensure_activation(h.d_normed, {rows, C}, tracker);
    ensure_activation(h.grad_partials, {lanes, V, C}, tracker);
    ctx.matmul.head_cross_entropy_vocab_blocked(h.normed16.data<lattice::bf16>(), head_weight, rows,
                                                C, V, targets, grad_scale, row_losses.data(),
                                                h.d_normed.f32(), h.grad_partials.f32(), lanes);
  } else if (h.backward_in_forward) {
    // The head's whole backward runs chunk by chunk inside the forward: d_normed and the weight
    // gradient's per-lane partials (added to the parameter gradient by backward) come out
    // while each chunk's logits gradient is in cache, and that gradient is never stored.
    h.d_logits16.reset();
    ensure_activation(h.d_normed, {rows, C}, tracker);
    ensure_activation(h.grad_partials, {lanes, V, C}, tracker);
    ctx.matmul.forward_backward_in_row_chunks(
        h.normed16.data<lattice::bf16>(), head_weight, rows, C, V, chunk_rows,
        [&](int64_t begin, int64_t n, const float* chunk, lattice::bf16* d_chunk16,
            int64_t stride) {
          k::cross_entropy_rows_bf16(d_chunk16, row_losses.data() + begin, chunk, targets + begin,
                                     n, V, grad_scale, row_work(), stride);
        },
        h.d_normed.f32(), h.grad_partials.f32(), lanes);
  } else {
    h.grad_partials.reset();
    lattice::bf16* d_logits16 = nullptr;
    if (grad_scale != 0.0f) {
      ensure_bf16_activation(h.d_logits16, {rows, V}, tracker);
      d_logits16 = h.d_logits16.data<lattice::bf16>();
    }
    ctx.matmul.multiply_in_row_chunks(
        h.normed16.data<lattice::bf16>(), head_weight, /*weight_transposed=*/true, rows, C, V,
        chunk_rows, [&](int64_t begin, int64_t n, const float* chunk) {
          k::cross_entropy_rows_bf16(d_logits16 != nullptr ? d_logits16 + begin * V : nullptr,
                                     row_losses.data() + begin, chunk, targets + begin, n, V,
                                     grad_scale, row_work(), V);
        });
  }
  double total = 0.0;  // row order: independent of the thread count
  for (double loss : row_losses) total += loss;
  return total;
}

const float* LmHead::logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                            int64_t rows, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  norm_forward(h, x, rows, tracker);
  ensure_activation(h.logits, {rows, V}, tracker);
  k::Bf16Operands keep;  // bf16: the rounded normed is kept for the weight gradient
  if (ctx.precision == k::Precision::bf16) {
    ensure_bf16_activation(h.normed16, {rows, C}, tracker);
    keep.in = h.normed16.data<lattice::bf16>();
    keep.weight = store_.bf16_value(weight_);
  }
  ctx.matmul.forward(h.logits.f32(), h.normed.f32(), store_.value(weight_), nullptr, rows, C, V,
                     ctx.precision, keep);
  return h.logits.f32();
}

void LmHead::backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                      int64_t rows, BackwardPart part, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  if (h.backward_in_forward) {  // d_normed is there; the weight gradient is in lanes
    if (part != BackwardPart::input) {
      const int64_t lanes = h.grad_partials.shape()[0];
      k::add_chunk_partials(store_.grad(weight_), h.grad_partials.f32(), lanes, V * C, V * C);
    }
  } else {
    backward_gemm(ctx, h, rows, part, tracker);
  }
  if (part != BackwardPart::weight) norm_backward(h, d_x, x, rows);
}

void LmHead::backward_gemm(const LayerContext& ctx, HeadActivations& h, int64_t rows,
                           BackwardPart part, MemoryTracker* tracker) {
  const int64_t C = C_, V = V_;
  if (part != BackwardPart::weight) ensure_activation(h.d_normed, {rows, C}, tracker);
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
  ctx.matmul.backward(d_in, d_weight, nullptr, d_logits, h.normed.f32(), store_.value(weight_),
                      rows, C, V, ctx.precision, rounded);
}

void LmHead::norm_backward(HeadActivations& h, float* d_x, const float* x, int64_t rows) {
  const int64_t C = C_;
  if (family_ == Family::gpt2) {
    k::layernorm_backward(d_x, store_.grad(norm_weight_), store_.grad(norm_bias_), h.d_normed.f32(),
                          x, store_.value(norm_weight_), h.norm_mean.f32(), h.norm_rstd.f32(), rows,
                          C);
  } else {
    k::rmsnorm_backward(d_x, store_.grad(norm_weight_), h.d_normed.f32(), x,
                        store_.value(norm_weight_), h.norm_rstd.f32(), rows, C);
  }
}

const float* LmHead::inference_logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                                      int64_t rows, MemoryTracker* tracker) {
  norm_forward(h, x, rows, tracker);
  ensure_activation(h.logits, {rows, V_}, tracker);
  ctx.matmul.forward(h.logits.f32(), h.normed.f32(), store_.value(weight_), nullptr, rows, C_, V_,
                     ctx.precision);
  return h.logits.f32();
}

}  // namespace lattice::model
