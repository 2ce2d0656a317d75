// Multi-head latent attention's input projections: see latent_projection.hpp.
#include "lattice/model/components/latent_projection.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/model/block.hpp"
#include "lattice/model/components/backward_slots.hpp"
#include "lattice/model/context_parallel.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

namespace {

// The first `width` columns of the [rows, from_width] rows at `from` into the first `width`
// columns of the [rows, to_width] rows at `to` (offset the pointers for other columns): one
// strided copy.
void copy_columns(const LayerContext& ctx, float* to, int64_t to_width, const float* from,
                  int64_t from_width, int64_t width, int64_t rows) {
  ctx.ops.memory().copy_rows(to, sizeof(float) * static_cast<size_t>(to_width), from,
                             sizeof(float) * static_cast<size_t>(from_width),
                             sizeof(float) * static_cast<size_t>(width), static_cast<size_t>(rows),
                             CopyKind::device_to_device);
}

// RoPE (or its inverse) on one head of `width` floats a row in x [B, T, ...] at the rows'
// positions: under context parallelism this rank's runs of each sequence (rope_at_runs), otherwise
// position_offset + the row's index.
void rotate_at_positions(const LayerContext& ctx, const k::RopeTable& table, float* x, int64_t B,
                         int64_t T, int64_t width, int64_t position_offset, bool inverse) {
  if (ctx.context == nullptr) {
    ctx.ops.rope(table, x, B, T, 1, width, T * width, position_offset, inverse);
    return;
  }
  check(position_offset == 0,
        "multi-head latent attention under context parallelism takes its positions from the "
        "sequence split, not an offset (internal error)");
  rope_at_runs(ctx.ops, ctx.context, table, x, B, T, 1, width, T * width, inverse);
}

}  // namespace

void LatentActivations::release() {
  for (Tensor* t : {&q_a, &compressed, &d_q_input, &d_kv_a}) t->reset();
  q_a_norm.release();
  kv_a_norm.release();
  for (LinearActivations* l : {&q_input, &kv_a, &q_b, &kv_b}) l->release();
}

LatentProjection::LatentProjection(ParameterStore& store, const std::string& prefix,
                                   const LatentAttentionDescription& d, const std::string& q_name,
                                   int64_t d_model, int64_t heads, int64_t v_head_dim,
                                   const k::RopeTable* rope, const parallel::SequenceLayout& layout,
                                   parallel::TensorSplit head_split)
    : layout_(layout),
      rope_(rope),
      C_(d_model),
      heads_(heads / layout.ranks()),
      nope_(d.qk_nope_head_dim),
      rope_dim_(d.qk_rope_head_dim),
      qk_(d.qk_head_dim()),
      v_(v_head_dim),
      q_rank_(d.q_lora_rank),
      kv_rank_(d.kv_lora_rank),
      softmax_scale_factor_(d.softmax_scale_factor) {
  check(d.kv_lora_rank > 0 && d.q_lora_rank >= 0 && d.qk_nope_head_dim >= 0,
        "multi-head latent attention needs kv_lora_rank > 0, q_lora_rank >= 0 (0: q_proj) and "
        "qk_nope_head_dim >= 0");
  check(d.qk_rope_head_dim > 0 && d.qk_rope_head_dim % 2 == 0,
        "multi-head latent attention's qk_rope_head_dim (" + std::to_string(d.qk_rope_head_dim) +
            ") must be a positive even number of rotated channels");
  check(rope != nullptr && rope->head_dim() == rope_dim_,
        "multi-head latent attention rotates qk_rope_head_dim = " + std::to_string(rope_dim_) +
            " channels per head: build its RoPE table with head_dim qk_rope_head_dim");
  check(heads % layout.ranks() == 0,
        "parallelism.tp = " + std::to_string(layout.ranks()) + " must divide the " +
            std::to_string(heads) +
            " heads of multi-head latent attention: pick a tp that divides them");
  check(d.softmax_scale_factor > 0,
        "multi-head latent attention's softmax scale factor must be positive (internal error)");
  // Hugging Face's module order: q (q_proj, or q_a_proj, q_a_layernorm, q_b_proj), then kv. The
  // projections whose output rows are per head (q_proj, q_b_proj: [q_nope | q_pe] per head;
  // kv_b_proj: [k_nope | v] per head) are column-split, each rank its heads' rows; the others are
  // whole on every rank.
  const parallel::LinearSplit by_heads = layout.split(head_split);
  if (has_q_rank()) {
    q_a_ = Linear(store, prefix + d.q_a, C_, q_rank_, false, InitKind::normal);
    q_a_norm_ = Norm(store, prefix + d.q_a_norm, NormKind::rms_norm, q_rank_, d.norm_eps);
    q_b_ = Linear(store, prefix + d.q_b, q_rank_, heads * qk_, false, InitKind::normal, by_heads);
  } else {
    q_ = Linear(store, prefix + q_name, C_, heads * qk_, false, InitKind::normal, by_heads);
  }
  kv_a_ = Linear(store, prefix + d.kv_a, C_, kv_rank_ + rope_dim_, false, InitKind::normal);
  kv_a_norm_ = Norm(store, prefix + d.kv_a_norm, NormKind::rms_norm, kv_rank_, d.norm_eps);
  kv_b_ = Linear(store, prefix + d.kv_b, kv_rank_, heads * (nope_ + v_), false, InitKind::normal,
                 by_heads);
  check(kv_b_.out_features() == heads_ * (nope_ + v_) &&
            (has_q_rank() ? q_b_ : q_).out_features() == heads_ * qk_,
        "multi-head latent attention's head projections are not split by heads (a parallelize "
        "plan that does not column-split the attention input is not supported with it)");
}

void LatentProjection::prepare(const LayerContext& ctx, LatentActivations& a, int64_t rows) const {
  // In bf16 the latent norms write their bf16 output straight into q_b's and kv_b's prepared input.
  const bool fp32_out = ctx.precision != k::Precision::bf16;
  if (has_q_rank()) {
    ensure_activation(a.q_a, {rows, q_rank_}, ctx);
    q_a_norm_.prepare(ctx, a.q_a_norm, rows, fp32_out, false);
  }
  ensure_activation(a.compressed, {rows, kv_rank_}, ctx);
  kv_a_norm_.prepare(ctx, a.kv_a_norm, rows, fp32_out, false);
}

void LatentProjection::rotate_queries(const LayerContext& ctx, float* q, int64_t B, int64_t T,
                                      bool inverse, int64_t position_offset) const {
  // Each head's last qk_rope_head_dim channels, one head at a time (rows of heads·qk floats).
  const int64_t width = heads_ * qk_;
  for (int64_t h = 0; h < heads_; ++h)
    rotate_at_positions(ctx, *rope_, q + h * qk_ + nope_, B, T, width, position_offset, inverse);
}

void LatentProjection::forward(const LayerContext& ctx, LatentActivations& a, float* q, float* k,
                               float* v, const float* in, const lattice::bf16* in16, int64_t B,
                               int64_t T, int64_t position_offset) {
  const int64_t rows = B * T, kv_a_width = kv_rank_ + rope_dim_, kv_b_width = nope_ + v_;
  const bool bf16 = ctx.precision == k::Precision::bf16;
  check(bf16 ? in16 != nullptr : in != nullptr,
        "multi-head latent attention: its normed input is missing (internal error)");
  // The x-reading projections: on the shared bf16 input in bf16, on the fp32 one otherwise.
  auto project_input = [&](Linear& l, LinearActivations& saved, float* out) {
    if (bf16)
      l.forward_shared_rows(ctx, saved, out, in16, rows, 0, rows);
    else
      l.forward(ctx, saved, out, in, rows);
  };
  // An inner projection behind a latent norm (bf16: the norm writes its bf16 input).
  auto project_normed = [&](const Norm& norm, NormActivations& normed, const float* x, Linear& l,
                            LinearActivations& saved, float* out) {
    if (bf16) {
      norm.forward_bf16(ctx, normed, l.prepare_bf16_input(ctx, saved, rows), x, rows);
      l.forward_prepared(ctx, saved, out, rows);
    } else {
      norm.forward(ctx, normed, normed.out.f32(), x, rows);
      l.forward(ctx, saved, out, normed.out.f32(), rows);
    }
  };
  if (has_q_rank()) {
    project_input(q_a_, a.q_input, a.q_a.f32());
    project_normed(q_a_norm_, a.q_a_norm, a.q_a.f32(), q_b_, a.q_b, q);
  } else {
    project_input(q_, a.q_input, q);
  }
  rotate_queries(ctx, q, B, T, false, position_offset);
  if (softmax_scale_factor_ != 1.0f)
    ctx.ops.scale_copy(q, q, rows * heads_ * qk_, softmax_scale_factor_);
  // kv_a's output [c | k_pe] and kv_b's per-head [k_nope | v] live only through the forward.
  Tensor kv_a_out, kv_b_out;
  ensure_activation(kv_a_out, {rows, kv_a_width}, ctx);
  ensure_activation(kv_b_out, {rows, heads_ * kv_b_width}, ctx);
  project_input(kv_a_, a.kv_a, kv_a_out.f32());
  copy_columns(ctx, a.compressed.f32(), kv_rank_, kv_a_out.f32(), kv_a_width, kv_rank_, rows);
  project_normed(kv_a_norm_, a.kv_a_norm, a.compressed.f32(), kv_b_, a.kv_b, kv_b_out.f32());
  float* k_pe = kv_a_out.f32() + kv_rank_;
  rotate_at_positions(ctx, *rope_, k_pe, B, T, kv_a_width, position_offset, false);
  // k per head [k_nope | k_pe] and v, as [rows · heads, ·] rows.
  copy_columns(ctx, k, qk_, kv_b_out.f32(), kv_b_width, nope_, rows * heads_);
  copy_columns(ctx, v, v_, kv_b_out.f32() + nope_, kv_b_width, v_, rows * heads_);
  for (int64_t h = 0; h < heads_; ++h)
    copy_columns(ctx, k + h * qk_ + nope_, heads_ * qk_, k_pe, kv_a_width, rope_dim_, rows);
}

LatentGradients LatentProjection::attention_gradients(const SublayerBackward& g,
                                                      LatentActivations& a) const {
  const int64_t rows = g.rows, width = heads_ * qk_;
  LatentGradients d;
  // Without a query rank d q is q_proj's output gradient: kept for its weight half.
  d.q = has_q_rank() ? g.get(slot::latent_q_gradient, rows * width)
                     : g.kept(a.d_q_input, slot::qkv_gradient, rows * width);
  d.k = g.get(slot::qkv_gradient + 1, rows * width);
  d.v = g.get(slot::qkv_gradient + 2, rows * heads_ * v_);
  return d;
}

LatentInputGradients LatentProjection::backward(const LayerContext& ctx, LatentActivations& a,
                                                const SublayerBackward& g, const LatentGradients& d,
                                                const float* in, const lattice::bf16* in16) {
  const int64_t rows = g.rows, B = g.B, T = g.T;
  const int64_t kv_a_width = kv_rank_ + rope_dim_, kv_b_width = nope_ + v_, width = heads_ * qk_;
  const bool bf16 = ctx.precision == k::Precision::bf16;
  // The inner projections read the latent norms' fp32 outputs (bf16: their prepared inputs).
  auto inner_input = [&](const NormActivations& normed) {
    return bf16 ? nullptr : normed.out.f32();
  };
  // Under tensor parallelism this rank's d q, k, v are its own heads', complete for them. What
  // reaches the four replicated parts from them is this rank's heads' share of a sum over all
  // heads, so each of their gradients is a partial sum over the group:
  //   - q_a_layernorm: its d_out is q_b_proj's input gradient from this rank's heads' rows,
  //   partial;
  //     the norm's backward is linear in d_out, so its weight gradient (all-reduced over the group,
  //     as Qwen 3's q/k norms' are: Norm::backward over split heads) and its d_in, q_a_proj's
  //     d_out, are partial.
  //   - kv_a_layernorm: the same through kv_b_proj: its weight gradient all-reduced, d c partial.
  //   - kv_a_proj_with_mqa: its d_out is [d c | d k_pe], d c partial (above) and d k_pe this rank's
  //     heads' sum, partial too.
  //   - q_a_proj: its d_out is the partial d_in of q_a_layernorm.
  // Both x-reading projections' output gradients are partial, so their input gradients are
  // partial and right to sum: they join the head projections' in g.d_rows, which the layout
  // reduces over the group once (all-reduced, or reduce-scattered under sequence parallelism).
  // None of the four has a complete output gradient, so nothing is counted twice. Their weight
  // gradients inᵀ·d_out, `in` the same on every rank, are linear in d_out: d_out itself is summed
  // over the group after the input halves read it (rows × width floats rather than the weight's),
  // and the weight halves (now or deferred) compute the summed gradient from it. q_proj (no query
  // rank) is column-split: its d_out is this rank's heads' own, nothing to sum.
  float* norm_partials = layout_.ranks() > 1
                             ? g.get(slot::latent_norm_partials, std::max(q_rank_, kv_rank_))
                             : nullptr;
  // Queries: RoPE's inverse, then (with a rank) q_b_proj and the query norm into q_a's d_out.
  if (softmax_scale_factor_ != 1.0f)
    ctx.ops.scale_copy(d.q, d.q, rows * width, softmax_scale_factor_);
  rotate_queries(ctx, d.q, B, T, true);
  float* d_q_input = d.q;
  if (has_q_rank()) {
    float* d_normed = g.get(slot::latent_normed_gradient, rows * std::max(q_rank_, kv_rank_));
    q_b_.backward(ctx, a.q_b, d_normed, d.q, inner_input(a.q_a_norm), rows);
    d_q_input = g.kept(a.d_q_input, slot::qkv_gradient, rows * q_rank_);
    q_a_norm_.backward(ctx, layout_, a.q_a_norm, d_q_input, d_normed, a.q_a.f32(), rows, nullptr,
                       norm_partials, /*over_split_heads=*/true);
  }
  // Keys and values: d [k_nope | v] per head for kv_b_proj; d k_pe summed over the heads.
  float* d_kv_b = g.get(slot::latent_kv_b_gradient, rows * heads_ * kv_b_width);
  copy_columns(ctx, d_kv_b, kv_b_width, d.k, qk_, nope_, rows * heads_);
  copy_columns(ctx, d_kv_b + nope_, kv_b_width, d.v, v_, v_, rows * heads_);
  float* d_k_pe = g.get(slot::latent_rope_gradient, rows * rope_dim_);
  float* d_head = g.get(slot::latent_rope_head_gradient, rows * rope_dim_);
  for (int64_t h = 0; h < heads_; ++h) {
    copy_columns(ctx, h == 0 ? d_k_pe : d_head, rope_dim_, d.k + h * qk_ + nope_, width, rope_dim_,
                 rows);
    if (h > 0) ctx.ops.add_inplace(d_k_pe, d_head, rows * rope_dim_);
  }
  rotate_at_positions(ctx, *rope_, d_k_pe, B, T, rope_dim_, 0, true);
  // kv_a_proj_with_mqa's d_out [d c | d k_pe], d c through kv_b_proj and the latent norm.
  float* d_kv_a = g.kept(a.d_kv_a, slot::latent_kv_a_gradient, rows * kv_a_width);
  copy_columns(ctx, d_kv_a + kv_rank_, kv_a_width, d_k_pe, rope_dim_, rope_dim_, rows);
  float* d_normed = g.get(slot::latent_normed_gradient, rows * std::max(q_rank_, kv_rank_));
  float* d_compressed = g.get(slot::latent_compressed_gradient, rows * kv_rank_);
  kv_b_.backward(ctx, a.kv_b, d_normed, d_kv_b, inner_input(a.kv_a_norm), rows);
  kv_a_norm_.backward(ctx, layout_, a.kv_a_norm, d_compressed, d_normed, a.compressed.f32(), rows,
                      nullptr, norm_partials, /*over_split_heads=*/true);
  copy_columns(ctx, d_kv_a, kv_a_width, d_compressed, kv_rank_, kv_rank_, rows);
  // The x-reading projections' input gradients, summed in module order into g.d_rows (and their
  // weight halves unless split: always split on a group of several ranks).
  check(layout_.ranks() == 1 || g.split,
        "multi-head latent attention under tensor parallelism runs its weight halves apart "
        "(internal error)");
  float* d_part = g.get(slot::projection_gradient, rows * C_);
  Linear& q_in = input_reader();
  if (bf16) {
    const lattice::bf16* weights_in = g.split ? nullptr : in16;
    q_in.backward_shared(ctx, a.q_input, g.d_rows, d_q_input, weights_in, rows);
    kv_a_.backward_shared(ctx, a.kv_a, d_part, d_kv_a, weights_in, rows);
  } else {
    input_projection_backward(ctx, g, q_in, a.q_input, g.d_rows, d_q_input, in);
    input_projection_backward(ctx, g, kv_a_, a.kv_a, d_part, d_kv_a, in);
  }
  ctx.ops.add_inplace(g.d_rows, d_part, rows * C_);
  sum_replicated_output_gradients(has_q_rank() ? d_q_input : nullptr, d_kv_a, rows);
  return {d_q_input, d_kv_a};
}

void LatentProjection::sum_replicated_output_gradients(float* d_q_input, float* d_kv_a,
                                                       int64_t rows) const {
  if (layout_.ranks() == 1) return;
  if (d_q_input != nullptr) layout_.all_reduce(d_q_input, rows * q_rank_);
  layout_.all_reduce(d_kv_a, rows * (kv_rank_ + rope_dim_));
}

void LatentProjection::weight_halves(const LayerContext& ctx, LatentActivations& a,
                                     const LatentInputGradients& d, const float* in,
                                     const lattice::bf16* in16, int64_t rows) {
  Linear& q_in = input_reader();
  if (ctx.precision == k::Precision::bf16) {
    q_in.backward_shared(ctx, a.q_input, nullptr, d.q_input, in16, rows);
    kv_a_.backward_shared(ctx, a.kv_a, nullptr, d.kv_a, in16, rows);
  } else {
    q_in.backward_weight(ctx, a.q_input, d.q_input, in, rows);
    kv_a_.backward_weight(ctx, a.kv_a, d.kv_a, in, rows);
  }
}

void LatentProjection::weight_pass(const LayerContext& ctx, LatentActivations& a, const float* in,
                                   const lattice::bf16* in16, int64_t rows) {
  weight_halves(ctx, a, {a.d_q_input.f32(), a.d_kv_a.f32()}, in, in16, rows);
  a.d_q_input.reset();
  a.d_kv_a.reset();
}

int64_t LatentProjection::saved_bytes(k::Precision precision, int64_t rows) const {
  // q_a's output and the compressed c (fp32), each latent norm's rstd, and its output: fp32, or in
  // bf16 the inner projection's prepared bf16 input.
  const int64_t normed = precision == k::Precision::bf16 ? 2 : 4;
  int64_t bytes = rows * (4 * kv_rank_ + 4 + normed * kv_rank_);
  if (has_q_rank()) bytes += rows * (4 * q_rank_ + 4 + normed * q_rank_);
  return bytes;
}

int64_t LatentProjection::scratch_floats(int64_t rows) const {
  // d q (its own slot with a rank, plus q_a's d_out), d k, d v, d [k_nope | v], d k_pe and one
  // head's, kv_a's d_out, a latent norm's d_out and d c; under tp a latent norm's partial weight
  // gradient.
  const int64_t width = heads_ * qk_;
  return rows * ((has_q_rank() ? width + q_rank_ : width) + width + heads_ * v_ +
                 heads_ * (nope_ + v_) + 2 * rope_dim_ + kv_rank_ + rope_dim_ +
                 std::max(q_rank_, kv_rank_) + kv_rank_) +
         (layout_.ranks() > 1 ? std::max(q_rank_, kv_rank_) : 0);
}

int64_t LatentProjection::pending_weight_floats(int64_t rows) const {
  return rows * (q_input_width() + kv_rank_ + rope_dim_);
}

int64_t LatentProjection::forward_transient_bytes(int64_t rows) const {
  return rows * 4 * (kv_rank_ + rope_dim_ + heads_ * (nope_ + v_));
}

}  // namespace lattice::model
