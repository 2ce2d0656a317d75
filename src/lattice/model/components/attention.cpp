// The attention sub-layer: see attention.hpp.
#include "lattice/model/components/attention.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

void AttentionActivations::release() {
  norm.release();
  for (Tensor* t : {&qkv, &qkv16, &q, &k, &v, &q_raw, &k_raw, &att, &lse, &d_out}) t->reset();
  latent.release();
  q_norm.release();
  k_norm.release();
  for (LinearActivations& l : input) l.release();
  output.release();
  for (Tensor& t : d_input) t.reset();
}

Attention::Attention(ParameterStore& store, const std::string& prefix,
                     const AttentionDescription& d, int64_t d_model, float norm_eps,
                     const parallel::SequenceLayout& layout, parallel::TensorSplit input_split,
                     parallel::TensorSplit output_split, const k::RopeTable* rope)
    : layout_(layout), rope_(rope), C_(d_model), head_dim_(d.head_dim), window_(d.sliding_window) {
  check(!d.rope || rope != nullptr, "rotary attention built without a RoPE table (internal error)");
  check(d.sliding_window >= 0, "the attention's sliding window (" +
                                   std::to_string(d.sliding_window) +
                                   ") must be 0 (none) or a positive number of positions");
  check(d.heads % layout.ranks() == 0 && d.kv_heads % layout.ranks() == 0,
        "parallelism.tp = " + std::to_string(layout.ranks()) + " must divide the " +
            std::to_string(d.heads) + " attention heads and the " + std::to_string(d.kv_heads) +
            " key/value heads: pick a tp that divides both");
  heads_ = d.heads / layout.ranks();
  kv_heads_ = d.kv_heads / layout.ranks();
  v_head_dim_ = d.v_head_dim == 0 ? head_dim_ : d.v_head_dim;
  check(v_head_dim_ > 0, "the attention's value head width (" + std::to_string(d.v_head_dim) +
                             ") must be 0 (the head width) or positive");
  check(v_head_dim_ == head_dim_ || d.packed.empty(),
        "a packed q | k | v projection has value heads as wide as its query-key heads (internal "
        "error)");
  A_ = heads_ * head_dim_;
  KV_ = kv_heads_ * head_dim_;
  O_ = heads_ * v_head_dim_;
  V_ = kv_heads_ * v_head_dim_;
  norm_ = Norm(store, prefix + d.norm, d.norm_kind, C_, norm_eps);
  if (d.latent.enabled()) {
    // Multi-head latent attention: q, k, v of this rank's heads from its latent projections (the
    // head projections column-split, the latent ones whole on every rank), the output row-split.
    check(d.packed.empty() && d.k.empty() && d.v.empty() && d.q_norm.empty() && !d.input_bias,
          "multi-head latent attention takes no packed, k or v projection, q/k norm or input bias "
          "(internal error)");
    check(d.head_dim == d.latent.qk_head_dim() && d.kv_heads == d.heads && d.rope,
          "multi-head latent attention has head_dim = qk_nope_head_dim + qk_rope_head_dim, as many "
          "key/value heads as query heads and RoPE (internal error)");
    latent_ = LatentProjection(store, prefix, d.latent, d.q, C_, d.heads, v_head_dim_, rope, layout,
                               input_split);
    rope_ = nullptr;  // the latent projections rotate their own rope channels
    output_ = Linear(store, prefix + d.out, d.heads * v_head_dim_, C_, d.output_bias,
                     InitKind::normal_residual, layout.split(output_split));
    return;
  }
  const int64_t q_width = d.heads * head_dim_, kv_width = d.kv_heads * head_dim_;
  const int64_t v_width = d.kv_heads * v_head_dim_, out_width = d.heads * v_head_dim_;
  // q, k, v column-split by heads (a packed projection: each rank its heads of each of the three
  // blocks; grouped-query attention splits the key/value heads too), the output row-split.
  if (!d.packed.empty()) {
    check(d.heads == d.kv_heads,
          "a packed q | k | v projection has as many key/value heads as "
          "query heads (internal error)");
    input_.emplace_back(store, prefix + d.packed, C_, 3 * q_width, d.input_bias, InitKind::normal,
                        layout.split(input_split, 3));
  } else {
    for (const auto& [name, width] : {std::pair{d.q, q_width}, {d.k, kv_width}, {d.v, v_width}})
      input_.emplace_back(store, prefix + name, C_, width, d.input_bias, InitKind::normal,
                          layout.split(input_split));
  }
  output_ = Linear(store, prefix + d.out, out_width, C_, d.output_bias, InitKind::normal_residual,
                   layout.split(output_split));
  qk_norm_ = !d.q_norm.empty();
  check(qk_norm_ == !d.k_norm.empty(), "a q/k norm names both norms (internal error)");
  if (qk_norm_) {
    check(!packed(), "a q/k norm needs q, k and v from separate projections (internal error)");
    // The norm weights are whole on every rank while the heads they scale are split: their
    // gradients are partial sums over the tensor-parallel group, reduced in backward.
    q_norm_ = Norm(store, prefix + d.q_norm, NormKind::rms_norm, head_dim_, norm_eps);
    k_norm_ = Norm(store, prefix + d.k_norm, NormKind::rms_norm, head_dim_, norm_eps);
  }
  fusable_ = packed() && !d.rope && norm_.writes_bf16();
}

k::AttentionShape Attention::shape(int64_t B, int64_t T) const {
  k::AttentionShape s = k::AttentionShape::contiguous(B, T, heads_, kv_heads_, head_dim_);
  s.window = window_;
  if (v_head_dim_ != head_dim_) {  // values of their own width, rows of V_ (q, k, v apart)
    s.v_head_dim = v_head_dim_;
    s.v_row_stride = V_;
    s.v_batch_stride = T * V_;
  }
  if (!packed()) return s;
  // q, k, v of `heads` heads packed per token as [q | k | v] (the projection's output here).
  s.q_row_stride = s.k_row_stride = s.v_row_stride = A_ + 2 * KV_;
  s.q_batch_stride = s.kv_batch_stride = T * (A_ + 2 * KV_);
  return s;
}

void Attention::prepare(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T,
                        bool cached) const {
  const int64_t rows = B * T, local = layout_.local_rows(rows);
  a.input.resize(input_.size());
  a.d_input.resize(input_.size());
  // Fused bf16: the norm's output exists only as the projection's bf16 input (on a sharded layout
  // this rank's rows of it, gathered), and in training q, k, v only in bf16.
  const bool fused = this->fused(ctx.precision), bf16_in = fused || shares_input(ctx.precision);
  norm_.prepare(ctx, a.norm, local, !bf16_in, bf16_in && layout_.sharded());
  if (packed()) {
    if (fused && !cached) {
      a.qkv.reset();
      ensure_bf16_activation(a.qkv16, {rows, A_ + 2 * KV_}, ctx);
    } else {
      a.qkv16.reset();
      ensure_activation(a.qkv, {rows, A_ + 2 * KV_}, ctx);
    }
  } else {
    ensure_activation(a.q, {rows, A_}, ctx);
    ensure_activation(a.k, {rows, KV_}, ctx);
    ensure_activation(a.v, {rows, V_}, ctx);
    if (qk_norm_) {
      ensure_activation(a.q_raw, {rows, A_}, ctx);
      ensure_activation(a.k_raw, {rows, KV_}, ctx);
      q_norm_.prepare(ctx, a.q_norm, rows * heads_, false, false);
      k_norm_.prepare(ctx, a.k_norm, rows * kv_heads_, false, false);
    }
    if (latent()) latent_.prepare(ctx, a.latent, rows);
  }
  ensure_activation(a.att, {rows, O_}, ctx);
  ensure_activation(a.lse, {B, heads_, T}, ctx);
}

Linear* Attention::bf16_reader(k::Precision precision) {
  if (!bf16_input(precision)) return nullptr;
  return latent() ? &latent_.input_reader() : &input_[0];
}

LinearActivations* Attention::reader_saved(AttentionActivations& a) const {
  return latent() ? &a.latent.q_input : &a.input[0];
}

const lattice::bf16* Attention::shared_input(const AttentionActivations& a) const {
  const LinearActivations* reader = nullptr;  // q_proj's (q_a_proj's under latent attention)
  if (latent())
    reader = &a.latent.q_input;
  else if (!a.input.empty())
    reader = &a.input[0];
  check(reader != nullptr && !reader->in16.empty(),
        "Attention: the shared bf16 input of q, k, v is gone (internal error)");
  return reader->in16.data<lattice::bf16>();
}

float* Attention::projection_output(AttentionActivations& a, size_t i) const {
  if (packed()) return a.qkv.f32();
  if (qk_norm_ && i < 2) return (i == 0 ? a.q_raw : a.k_raw).f32();
  return (i == 0 ? a.q : i == 1 ? a.k : a.v).f32();
}

void Attention::normalize_q_and_k(const LayerContext& ctx, AttentionActivations& a,
                                  int64_t rows) const {
  if (!qk_norm_) return;
  // [rows, heads · head_dim] is [rows · heads, head_dim]: one norm row per head of each token.
  q_norm_.forward(ctx, a.q_norm, a.q.f32(), a.q_raw.f32(), rows * heads_);
  k_norm_.forward(ctx, a.k_norm, a.k.f32(), a.k_raw.f32(), rows * kv_heads_);
}

void Attention::project(const LayerContext& ctx, AttentionActivations& a, NormedRows& in,
                        int64_t rows, bool cached) {
  if (fused(ctx.precision)) {
    Linear& qkv = input_[0];
    if (cached) {  // one rank: fp32 q, k, v for the KV cache
      in.gather.wait();
      qkv.forward_prepared(ctx, a.input[0], a.qkv.f32(), rows);
      return;
    }
    // The projection's output (bias included) rounded to bf16 as it is produced: the same values
    // attention would round from an fp32 qkv, which is never stored.
    layout_.forward_gathered(
        in.gather,
        [&](int64_t first, int64_t count, bool own) {
          qkv.forward_prepared_to_bf16_rows(ctx, a.input[0], a.qkv16.data<lattice::bf16>(), rows,
                                            first, count, own ? in.own16 : nullptr);
        },
        rows);
    // A sharded layout keeps this rank's rows (the norm's out16), not the gathered input.
    if (layout_.sharded()) Linear::release_prepared_input(a.input[0]);
    return;
  }
  if (shares_input(ctx.precision)) {
    // q, k and v on the one bf16 input the norm wrote (this rank's rows from its out16 while the
    // others are gathered): the roundings each would make of the fp32 norm output, bit for bit.
    const lattice::bf16* in16 = shared_input(a);
    layout_.forward_gathered(
        in.gather,
        [&](int64_t first, int64_t count, bool own) {
          for (size_t i = 0; i < input_.size(); ++i)
            input_[i].forward_shared_rows(ctx, a.input[i], projection_output(a, i), in16, rows,
                                          first, count, own ? in.own16 : nullptr);
        },
        rows);
    // A sharded layout keeps this rank's rows (the norm's out16), not the gathered input.
    if (layout_.sharded()) Linear::release_prepared_input(a.input[0]);
    return;
  }
  layout_.forward_gathered(
      in.gather,
      [&](int64_t first, int64_t count, bool own) {
        for (size_t i = 0; i < input_.size(); ++i) {
          Linear& l = input_[i];
          float* out = projection_output(a, i);
          if (own)
            l.forward_piece(ctx, a.input[i], out + first * l.out_features(), in.own, rows, first,
                            count);
          else
            l.forward_rows(ctx, a.input[i], out, in.all, rows, first, count);
        }
      },
      rows);
  // A sharded layout keeps this rank's rows (the norm's output), not the gathered input or its
  // bf16 rounding: backward gathers and rounds it again (the same bits).
  if (layout_.sharded())
    for (LinearActivations& l : a.input) l.release();
}

void Attention::attend(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T) {
  const k::AttentionShape s = shape(B, T);
  ContextAttention& attention = core(ctx);
  if (!packed()) {
    attention.forward(ctx.ops, a.att.f32(), a.lse.f32(), a.q.f32(), a.k.f32(), a.v.f32(), s,
                      ctx.precision);
    return;
  }
  if (fused(ctx.precision)) {
    attention.forward_packed_bf16(ctx.ops, ctx.tracker, a.att.f32(), a.lse.f32(),
                                  a.qkv16.data<lattice::bf16>(), A_ + 2 * KV_, A_, A_ + KV_, s);
    return;
  }
  const float* qkv = a.qkv.f32();
  attention.forward(ctx.ops, a.att.f32(), a.lse.f32(), qkv, qkv + A_, qkv + A_ + KV_, s,
                    ctx.precision);
}

void Attention::project_out(const LayerContext& ctx, AttentionActivations& a, float* x_out,
                            const float* x, int64_t rows, Tensor& partial) {
  output_projection_forward(
      ctx, layout_, x_out, rows, C_, partial, [&](float* out, int64_t first, int64_t count) {
        output_.forward_rows(ctx, a.output, out, a.att.f32(), rows, first, count);
      });
  ctx.ops.add_inplace(x_out, x, layout_.local_rows(rows) * C_);
}

void Attention::forward(const LayerContext& ctx, AttentionActivations& a, float* x_out,
                        const float* x, int64_t B, int64_t T, Tensor& partial) {
  const int64_t rows = B * T;
  {
    Tensor gathered;  // fp32 sharded layouts: the norm's output over all rows, for the GEMMs
    NormedRows in = normalize(ctx, layout_, norm_, a.norm, x, rows, gathered,
                              bf16_reader(ctx.precision), reader_saved(a));
    if (latent()) {  // on all rows: gathered first on a sharded layout
      in.gather.wait();
      const bool shared = shares_input(ctx.precision);
      latent_.forward(ctx, a.latent, a.q.f32(), a.k.f32(), a.v.f32(), in.all,
                      shared ? shared_input(a) : nullptr, B, T);
      // A sharded layout keeps this rank's rows (the norm's out16), not the gathered bf16 input.
      if (shared && layout_.sharded()) Linear::release_prepared_input(a.latent.q_input);
    } else {
      project(ctx, a, in, rows, /*cached=*/false);
    }
  }
  normalize_q_and_k(ctx, a, rows);
  if (rope_ != nullptr) {
    ContextAttention& attention = core(ctx);
    rope_at_runs(ctx.ops, &attention, *rope_, a.q.f32(), B, T, heads_, A_, T * A_, false);
    rope_at_runs(ctx.ops, &attention, *rope_, a.k.f32(), B, T, kv_heads_, KV_, T * KV_, false);
  }
  attend(ctx, a, B, T);
  project_out(ctx, a, x_out, x, rows, partial);
}

void Attention::forward_cached(const LayerContext& ctx, AttentionActivations& a, float* x_out,
                               const float* x, int64_t B, int64_t n, KvCache& cache,
                               int64_t cache_layer, Tensor& partial) {
  check(layout_.ranks() == 1,
        "KV-cached generation runs on one rank: generate from the run's (logical) checkpoint");
  // RoPE at the absolute positions [start, start + n); the keys read are the cache's slots, the
  // new ones last (a rolled cache has dropped only keys outside every new query's window).
  const int64_t rows = B * n, start = cache.length(), kv_len = cache.stored() + n;
  {
    Tensor gathered;
    NormedRows in = normalize(ctx, layout_, norm_, a.norm, x, rows, gathered,
                              bf16_reader(ctx.precision), reader_saved(a));
    if (latent()) {  // q, k, v of the new tokens, RoPE at their positions [start, start + n)
      in.gather.wait();
      latent_.forward(ctx, a.latent, a.q.f32(), a.k.f32(), a.v.f32(), in.all,
                      shares_input(ctx.precision) ? shared_input(a) : nullptr, B, n, start);
    } else {
      project(ctx, a, in, rows, /*cached=*/true);
    }
  }
  if (latent()) {
    // The cache holds the expanded keys (qk wide) and values (v_head_dim wide) of every head:
    // transformers' DynamicCache holds the compressed latent and k_pe instead, and expands them
    // for every step; the attention over them is the same.
    cache.write(cache_layer, a.k.f32(), a.v.f32(), KV_, n, V_);
    k::AttentionShape s = shape(B, n);
    s.kv_len = kv_len;
    s.k_row_stride = cache.row_stride();
    s.v_row_stride = cache.value_row_stride();
    s.kv_batch_stride = cache.batch_stride();
    s.v_batch_stride = cache.value_batch_stride();
    ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), a.q.f32(), cache.keys(cache_layer),
                              cache.values(cache_layer), s, ctx.precision, {});
    project_out(ctx, a, x_out, x, rows, partial);
    return;
  }
  check(v_head_dim_ == head_dim_,
        "KV-cached generation with value heads narrower or wider than the key heads is built for "
        "latent attention only (internal error)");
  normalize_q_and_k(ctx, a, rows);
  const float *q = a.q.f32(), *keys = a.k.f32(), *values = a.v.f32();
  int64_t stride = KV_;
  if (packed()) {
    q = a.qkv.f32();
    keys = q + A_;
    values = q + A_ + KV_;
    stride = A_ + 2 * KV_;
  }
  if (rope_ != nullptr) {  // RoPE at the absolute positions; cached keys are stored rotated
    ctx.ops.rope(*rope_, a.q.f32(), B, n, heads_, A_, n * A_, start, false);
    ctx.ops.rope(*rope_, a.k.f32(), B, n, kv_heads_, KV_, n * KV_, start, false);
  }
  cache.write(cache_layer, keys, values, stride, n);
  // The new queries sit at the end of the cached keys.
  k::AttentionShape s = shape(B, n);
  s.kv_len = kv_len;
  s.k_row_stride = s.v_row_stride = cache.row_stride();
  s.kv_batch_stride = cache.batch_stride();
  ctx.ops.attention_forward(a.att.f32(), a.lse.f32(), q, cache.keys(cache_layer),
                            cache.values(cache_layer), s, ctx.precision, {});
  project_out(ctx, a, x_out, x, rows, partial);
}

void Attention::recompute(const LayerContext& ctx, AttentionActivations& a, int64_t B, int64_t T) {
  if (!a.att.empty()) return;
  ensure_activation(a.att, {B * T, O_}, ctx);
  ensure_activation(a.lse, {B, heads_, T}, ctx);
  attend(ctx, a, B, T);
  // The output projection's bf16 input was rounded from these same values: it stays valid.
  if (!a.output.prepared && a.output.rounded_from != nullptr) a.output.rounded_from = a.att.f32();
}

float* Attention::output_gradient_buffer(const SublayerBackward& g, AttentionActivations& a) const {
  if (layout_.sharded()) return g.get(slot::residual_gradient, g.local * C_);
  return g.kept(a.d_out, slot::residual_gradient, g.rows * C_);
}

void Attention::backward(const LayerContext& ctx, AttentionActivations& a,
                         const SublayerBackward& g, float* d_x, const float* d_x_out,
                         const float* x) {
  const int64_t rows = g.rows;
  const bool fused = this->fused(ctx.precision), shared = shares_input(ctx.precision);
  // The output projection's d_out over all rows.
  const float* d_out = d_x_out;
  if (layout_.sharded()) {
    float* all = g.kept(a.d_out, slot::output_gradient_rows, rows * C_);
    layout_.gather(all, d_x_out, rows, C_);
    d_out = all;
  }
  const float* in = nullptr;  // the input projections' fp32 input over all rows
  parallel::GroupCollective in_gather;
  if (!g.defer)
    in_gather = regather(ctx, layout_, a.norm, g.regathered, rows, &in, bf16_reader(ctx.precision),
                         reader_saved(a));
  float* d_att = g.get(slot::attention_output_gradient, rows * O_);
  output_projection_backward(ctx, g, output_, a.output, d_att, d_out, a.att.f32());
  const k::AttentionShape s = shape(g.B, g.T);
  ContextAttention& attention = core(ctx);
  std::function<void()> weight_halves;
  if (latent()) {
    // The latent projections' backward from the attention core's d q, k, v: their input
    // gradients summed into g.d_rows (reduced below like the other attentions'), their weight
    // halves in it unless split (deferred, or several ranks: then below or in weight_pass).
    const LatentGradients d = latent_.attention_gradients(g, a.latent);
    attention.backward(ctx.ops, d.q, d.k, d.v, d_att, a.q.f32(), a.k.f32(), a.v.f32(), a.att.f32(),
                       a.lse.f32(), s, ctx.precision);
    // Split halves read the shared bf16 input in weight_halves only (deferred: gathered again
    // later on a sharded layout).
    const LatentInputGradients kept =
        latent_.backward(ctx, a.latent, g, d, in, shared && !g.split ? shared_input(a) : nullptr);
    weight_halves = [&, kept] {
      latent_.weight_halves(ctx, a.latent, kept, in, shared ? shared_input(a) : nullptr, rows);
    };
  } else if (fused) {
    // The projection's bias gradient comes out of the attention backward (the column sums of the
    // unrounded d q, k, v, in an order fixed by the shape).
    auto* d_qkv16 = reinterpret_cast<lattice::bf16*>(
        g.kept(a.d_input[0], slot::qkv_gradient, rows * (A_ + 2 * KV_)));
    Linear& qkv = input_[0];
    attention.backward_packed_bf16(ctx.ops, ctx.tracker, d_qkv16, qkv.bias_grad(), d_att,
                                   a.qkv16.data<lattice::bf16>(), A_ + 2 * KV_, A_, A_ + KV_,
                                   a.att.f32(), a.lse.f32(), s);
    if (g.split)
      qkv.backward_input_rounded(ctx, g.d_rows, d_qkv16, rows);
    else
      qkv.backward_rounded(ctx, a.input[0], g.d_rows, d_qkv16, nullptr, rows);
    weight_halves = [&] { qkv.backward_rounded(ctx, a.input[0], nullptr, d_qkv16, nullptr, rows); };
  } else {
    std::vector<float*> d(input_.size());
    for (size_t i = 0; i < input_.size(); ++i)
      d[i] = g.kept(a.d_input[i], slot::qkv_gradient + static_cast<int>(i),
                    rows * input_[i].out_features());
    if (packed()) {
      const float* qkv = a.qkv.f32();
      attention.backward(ctx.ops, d[0], d[0] + A_, d[0] + A_ + KV_, d_att, qkv, qkv + A_,
                         qkv + A_ + KV_, a.att.f32(), a.lse.f32(), s, ctx.precision);
    } else {
      // Behind a q/k norm the attention's d q and d k are the normed ones': they go through
      // RoPE's backward and the norms' into the projections' d q and d k.
      float* dq = qk_norm_ ? g.get(slot::normed_q_gradient, rows * A_) : d[0];
      float* dk = qk_norm_ ? g.get(slot::normed_k_gradient, rows * KV_) : d[1];
      attention.backward(ctx.ops, dq, dk, d[2], d_att, a.q.f32(), a.k.f32(), a.v.f32(), a.att.f32(),
                         a.lse.f32(), s, ctx.precision);
      if (rope_ != nullptr) {
        rope_at_runs(ctx.ops, &attention, *rope_, dq, s.batch, g.T, heads_, A_, g.T * A_, true);
        rope_at_runs(ctx.ops, &attention, *rope_, dk, s.batch, g.T, kv_heads_, KV_, g.T * KV_,
                     true);
      }
      if (qk_norm_) {
        // Under tp each rank's heads give a partial sum of the weights' gradients (all-reduced).
        float* partials = layout_.ranks() > 1 ? g.get(slot::qk_norm_partials, head_dim_) : nullptr;
        q_norm_.backward(ctx, layout_, a.q_norm, d[0], dq, a.q_raw.f32(), rows * heads_, nullptr,
                         partials, /*over_split_heads=*/true);
        k_norm_.backward(ctx, layout_, a.k_norm, d[1], dk, a.k_raw.f32(), rows * kv_heads_, nullptr,
                         partials, /*over_split_heads=*/true);
      }
    }
    // The input gradients summed in projection order: q's, then k's, then v's added.
    float* d_part = input_.size() > 1 ? g.get(slot::projection_gradient, rows * C_) : nullptr;
    for (size_t i = 0; i < input_.size(); ++i) {
      float* d_in = i == 0 ? g.d_rows : d_part;
      if (shared)  // the input half, or both halves on the shared bf16 input
        input_[i].backward_shared(ctx, a.input[i], d_in, d[i], g.split ? nullptr : shared_input(a),
                                  rows);
      else
        input_projection_backward(ctx, g, input_[i], a.input[i], d_in, d[i], in);
      if (i > 0) ctx.ops.add_inplace(g.d_rows, d_part, rows * C_);
    }
    weight_halves = [&, d] {
      for (size_t i = 0; i < input_.size(); ++i) {
        if (shared)
          input_[i].backward_shared(ctx, a.input[i], nullptr, d[i], shared_input(a), rows);
        else
          input_[i].backward_weight(ctx, a.input[i], d[i], in, rows);
      }
    };
  }
  finish_input_projections(layout_, g, C_, in_gather, weight_halves);
  if (layout_.sharded() && (fused || shared) && !g.defer)
    Linear::release_prepared_input(*reader_saved(a));
  norm_.backward(ctx, layout_, a.norm, d_x, g.d_norm, x, g.local, d_x_out, g.norm_partials);
}

void Attention::weight_pass(const LayerContext& ctx, AttentionActivations& a, int64_t rows,
                            float* gathered) {
  const bool fused = this->fused(ctx.precision), shared = shares_input(ctx.precision);
  const float* in = nullptr;
  regather(ctx, layout_, a.norm, gathered, rows, &in, bf16_reader(ctx.precision), reader_saved(a))
      .wait();
  output_.backward_weight(ctx, a.output, a.d_out.f32(), a.att.f32(), rows);
  if (latent()) {
    latent_.weight_pass(ctx, a.latent, in, shared ? shared_input(a) : nullptr, rows);
    if (shared && layout_.sharded()) Linear::release_prepared_input(a.latent.q_input);
  } else if (fused) {
    input_[0].backward_rounded(ctx, a.input[0], nullptr,
                               reinterpret_cast<const lattice::bf16*>(a.d_input[0].f32()), nullptr,
                               rows);
    if (layout_.sharded()) Linear::release_prepared_input(a.input[0]);
  } else {
    for (size_t i = 0; i < input_.size(); ++i) {
      if (shared)
        input_[i].backward_shared(ctx, a.input[i], nullptr, a.d_input[i].f32(), shared_input(a),
                                  rows);
      else
        input_[i].backward_weight(ctx, a.input[i], a.d_input[i].f32(), in, rows);
    }
    if (shared && layout_.sharded()) Linear::release_prepared_input(a.input[0]);
  }
  a.d_out.reset();
  for (Tensor& t : a.d_input) t.reset();
}

int64_t Attention::attention_output_bytes(int64_t B, int64_t T) const {
  return B * T * O_ * 4 + B * heads_ * T * 4;  // att [rows, O] and lse [B, H, T], fp32
}

int64_t Attention::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // The norm's output and statistics on this rank's rows (local); q, k, v on all rows; the
  // attention output and log-sum-exp; in bf16 the Linears' kept bf16 inputs.
  const int64_t rows = B * T, local = layout_.local_rows(rows);
  const int64_t qkv = A_ + KV_ + V_, stats = norm_.stats_bytes_per_row();
  if (fused(precision))  // the norm's bf16 output, bf16 q, k, v, the output projection's bf16 input
    return local * (2 * C_ + stats) + rows * (2 * qkv + 2 * O_) + attention_output_bytes(B, T);
  // q, k, v apart in bf16: the norm's output only as their one shared bf16 input (q_proj's, or
  // this rank's rows of it in the norm's out16 on a sharded layout).
  const bool shared = shares_input(precision);
  int64_t bytes =
      local * ((shared ? 2 : 4) * C_ + stats) + rows * 4 * qkv + attention_output_bytes(B, T);
  // A q/k norm's raw q and k and its statistics per head.
  if (qk_norm_) bytes += rows * 4 * (A_ + KV_) + rows * 4 * (heads_ + kv_heads_);
  if (latent()) bytes += latent_.saved_bytes(precision, rows);
  // bf16 without the fused paths: the output projection's rounding of att, and each input
  // projection's rounding of the norm output (not kept on a sharded layout: gathered again).
  if (precision == k::Precision::bf16)
    bytes +=
        rows * 2 * O_ +
        (layout_.sharded() || shared ? 0 : rows * 2 * C_ * static_cast<int64_t>(input_.size()));
  return bytes;
}

int64_t Attention::scratch_floats(int64_t rows) const {
  // d_att; d q, k, v; behind a q/k norm the normed d q and d k
  if (latent()) return rows * O_ + latent_.scratch_floats(rows);
  return rows * O_ + rows * (A_ + KV_ + V_) + (qk_norm_ ? rows * (A_ + KV_) : 0) +
         (qk_norm_ && layout_.ranks() > 1 ? head_dim_ : 0);
}

int64_t Attention::pending_weight_floats(int64_t rows) const {
  if (latent()) return rows * C_ + latent_.pending_weight_floats(rows);
  return rows * C_ + rows * (A_ + KV_ + V_);  // the output projection's d_out; d q, k, v
}

int64_t Attention::entry_transient_bytes(k::Precision precision, int64_t rows) const {
  // Sharded layouts: the norm output gathered for the input projections (fp32, or bf16 in the
  // fused projection's prepared input, freed after the GEMM), and without the fused paths in bf16
  // each projection's rounding of it. Multi-head latent attention: its forward's kv_a and kv_b
  // outputs beside that gathered input (fp32, or bf16 in its shared input).
  if (latent())
    return latent_.forward_transient_bytes(rows) +
           (!layout_.sharded() ? 0 : rows * C_ * (shares_input(precision) ? 2 : 4));
  if (!layout_.sharded()) return 0;
  if (fused(precision) || shares_input(precision)) return rows * C_ * 2;
  return rows * C_ *
         (4 + (precision == k::Precision::bf16 ? 2 * static_cast<int64_t>(input_.size()) : 0));
}

}  // namespace lattice::model
