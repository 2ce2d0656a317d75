// The SwiGLU MLP: see swiglu_mlp.hpp.
#include "lattice/model/components/swiglu_mlp.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

void SwiGluActivations::release() {
  for (Tensor* t : {&gate, &up, &h, &d_gate, &d_up}) t->reset();
  for (LinearActivations* l : {&gate_saved, &up_saved, &down_saved}) l->release();
  shared_input = false;
}

SwiGluProjections::SwiGluProjections(ParameterStore& store, const std::string& prefix,
                                     const SwiGluDescription& d, int64_t d_model,
                                     const parallel::SequenceLayout& layout,
                                     parallel::TensorSplit input_split,
                                     parallel::TensorSplit output_split)
    : layout_(layout), C_(d_model) {
  check(d.hidden % layout.ranks() == 0,
        "parallelism.tp = " + std::to_string(layout.ranks()) + " must divide the MLP width " +
            std::to_string(d.hidden) + ": pick a tp that divides it");
  gate_ = Linear(store, prefix + d.gate, C_, d.hidden, false, InitKind::normal,
                 layout.split(input_split));
  up_ = Linear(store, prefix + d.up, C_, d.hidden, false, InitKind::normal,
               layout.split(input_split));
  down_ = Linear(store, prefix + d.down, d.hidden, C_, false, InitKind::normal_residual,
                 layout.split(output_split));
  F_ = gate_.out_features();
}

void SwiGluProjections::prepare(const LayerContext& ctx, SwiGluActivations& a, int64_t rows) const {
  for (Tensor* t : {&a.gate, &a.up, &a.h}) ensure_activation(*t, {rows, F_}, ctx);
}

const lattice::bf16* SwiGluProjections::shared_input(const SwiGluActivations& a) const {
  check(a.shared_input && !a.gate_saved.in16.empty(),
        "SwiGLU: the shared bf16 input of gate and up is gone (internal error)");
  return a.gate_saved.in16.data<lattice::bf16>();
}

void SwiGluProjections::forward(const LayerContext& ctx, SwiGluActivations& a, NormedRows& in,
                                Tensor& gathered, float* x_out, int64_t rows, Tensor& partial) {
  a.shared_input = in.all == nullptr;
  if (a.shared_input) {
    // gate and up on the one bf16 input the norm wrote (this rank's rows from its out16 while the
    // others are gathered): the roundings each would make of the fp32 norm output, bit for bit.
    const lattice::bf16* in16 = shared_input(a);
    layout_.forward_gathered(
        in.gather,
        [&](int64_t first, int64_t count, bool own) {
          gate_.forward_shared_rows(ctx, a.gate_saved, a.gate.f32(), in16, rows, first, count,
                                    own ? in.own16 : nullptr);
          up_.forward_shared_rows(ctx, a.up_saved, a.up.f32(), in16, rows, first, count,
                                  own ? in.own16 : nullptr);
        },
        rows);
    // A sharded layout keeps this rank's rows (the norm's out16), not the gathered input.
    if (layout_.sharded()) Linear::release_prepared_input(a.gate_saved);
  } else {
    forward_fp32_input(ctx, a, in, rows);
  }
  gathered.reset();
  ctx.ops.swiglu_forward(a.h.f32(), a.gate.f32(), a.up.f32(), rows * F_);
  output_projection_forward(
      ctx, layout_, x_out, rows, C_, partial, [&](float* out, int64_t first, int64_t count) {
        down_.forward_rows(ctx, a.down_saved, out, a.h.f32(), rows, first, count);
      });
}

void SwiGluProjections::forward_fp32_input(const LayerContext& ctx, SwiGluActivations& a,
                                           NormedRows& in, int64_t rows) {
  layout_.forward_gathered(
      in.gather,
      [&](int64_t first, int64_t count, bool own) {
        for (auto [layer, saved, out] : {std::tuple{&gate_, &a.gate_saved, a.gate.f32()},
                                         std::tuple{&up_, &a.up_saved, a.up.f32()}}) {
          if (own)
            layer->forward_piece(ctx, *saved, out + first * F_, in.own, rows, first, count);
          else
            layer->forward_rows(ctx, *saved, out, in.all, rows, first, count);
        }
      },
      rows);
  // A sharded layout keeps this rank's rows of the norm output, not the gathered input or its
  // bf16 rounding: backward gathers and rounds it again (the same bits).
  if (layout_.sharded())
    for (LinearActivations* l : {&a.gate_saved, &a.up_saved}) l->release();
}

std::function<void()> SwiGluProjections::backward(const LayerContext& ctx, SwiGluActivations& a,
                                                  const SublayerBackward& g, const float* d_y,
                                                  const float* in) {
  const int64_t rows = g.rows;
  float* d_h = g.get(slot::mlp_hidden_gradient, rows * F_);
  float* d_gate = g.kept(a.d_gate, slot::mlp_input_gradient, rows * F_);
  float* d_up = g.kept(a.d_up, slot::mlp_input_gradient + 1, rows * F_);
  float* d_part = g.get(slot::projection_gradient, rows * C_);
  output_projection_backward(ctx, g, down_, a.down_saved, d_h, d_y, a.h.f32());
  ctx.ops.swiglu_backward(d_gate, d_up, d_h, a.gate.f32(), a.up.f32(), rows * F_);
  if (a.shared_input) {  // the input halves, or both halves on the shared bf16 input
    const lattice::bf16* in16 = g.split ? nullptr : shared_input(a);
    gate_.backward_shared(ctx, a.gate_saved, g.d_rows, d_gate, in16, rows);
    up_.backward_shared(ctx, a.up_saved, d_part, d_up, in16, rows);
  } else {
    input_projection_backward(ctx, g, gate_, a.gate_saved, g.d_rows, d_gate, in);
    input_projection_backward(ctx, g, up_, a.up_saved, d_part, d_up, in);
  }
  ctx.ops.add_inplace(g.d_rows, d_part, rows * C_);
  return [this, &ctx, &a, d_gate, d_up, in, rows] {
    if (a.shared_input) {
      gate_.backward_shared(ctx, a.gate_saved, nullptr, d_gate, shared_input(a), rows);
      up_.backward_shared(ctx, a.up_saved, nullptr, d_up, shared_input(a), rows);
      return;
    }
    gate_.backward_weight(ctx, a.gate_saved, d_gate, in, rows);
    up_.backward_weight(ctx, a.up_saved, d_up, in, rows);
  };
}

void SwiGluProjections::weight_pass(const LayerContext& ctx, SwiGluActivations& a, const float* d_y,
                                    const float* in, int64_t rows) {
  down_.backward_weight(ctx, a.down_saved, d_y, a.h.f32(), rows);
  if (a.shared_input) {
    gate_.backward_shared(ctx, a.gate_saved, nullptr, a.d_gate.f32(), shared_input(a), rows);
    up_.backward_shared(ctx, a.up_saved, nullptr, a.d_up.f32(), shared_input(a), rows);
  } else {
    gate_.backward_weight(ctx, a.gate_saved, a.d_gate.f32(), in, rows);
    up_.backward_weight(ctx, a.up_saved, a.d_up.f32(), in, rows);
  }
  a.d_gate.reset();
  a.d_up.reset();
}

int64_t SwiGluProjections::saved_bytes(k::Precision precision, int64_t rows,
                                       bool shared_input) const {
  // gate, up and h in fp32; in bf16 down's rounding of h and gate's and up's of the norm output
  // (not kept on a sharded layout: gathered and rounded again; a shared input is the caller's).
  int64_t bytes = rows * 4 * 3 * F_;
  if (precision == k::Precision::bf16)
    bytes += rows * 2 * F_ + (layout_.sharded() || shared_input ? 0 : rows * 2 * 2 * C_);
  return bytes;
}

int64_t SwiGluProjections::entry_transient_bytes(k::Precision precision, int64_t rows,
                                                 bool shared_input) const {
  // Sharded layouts: the norm output gathered (fp32) and in bf16 gate's and up's roundings of it;
  // a shared input: gathered in bf16 into gate's prepared input only.
  if (!layout_.sharded()) return 0;
  if (shared_input) return rows * C_ * 2;
  return rows * C_ * (4 + (precision == k::Precision::bf16 ? 4 : 0));
}

void SwiGluMlpActivations::release() {
  FeedForwardActivations::release();
  swiglu.release();
}

SwiGluMlp::SwiGluMlp(ParameterStore& store, const std::string& prefix,
                     const SwiGluMlpDescription& d, int64_t d_model, float norm_eps,
                     const parallel::SequenceLayout& layout, parallel::TensorSplit input_split,
                     parallel::TensorSplit output_split)
    : layout_(layout), C_(d_model) {
  norm_ = Norm(store, prefix + d.norm, d.norm_kind, C_, norm_eps);
  swiglu_ =
      SwiGluProjections(store, prefix, d.projections, d_model, layout, input_split, output_split);
}

std::unique_ptr<FeedForwardActivations> SwiGluMlp::make_activations() const {
  return std::make_unique<SwiGluMlpActivations>();
}

void SwiGluMlp::prepare(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows) const {
  auto& a = mlp_saved_as<SwiGluMlpActivations>(base);
  const bool shared = shares_input(ctx.precision);
  norm_.prepare(ctx, a.norm, layout_.local_rows(rows), !shared, shared && layout_.sharded());
  swiglu_.prepare(ctx, a.swiglu, rows);
}

void SwiGluMlp::forward(const LayerContext& ctx, FeedForwardActivations& base, float* x_out,
                        const float* x, int64_t rows, Tensor& partial, float loss_scale) {
  (void)loss_scale;
  auto& a = mlp_saved_as<SwiGluMlpActivations>(base);
  Tensor gathered;
  const bool shared = shares_input(ctx.precision);
  NormedRows in = normalize(ctx, layout_, norm_, a.norm, x, rows, gathered,
                            shared ? swiglu_.shared_input_owner() : nullptr, &a.swiglu.gate_saved);
  swiglu_.forward(ctx, a.swiglu, in, gathered, x_out, rows, partial);
  ctx.ops.add_inplace(x_out, x, layout_.local_rows(rows) * C_);
}

void SwiGluMlp::backward(const LayerContext& ctx, FeedForwardActivations& base,
                         const SublayerBackward& g, float* d_x, const float* d_x_out,
                         const float* x) {
  auto& a = mlp_saved_as<SwiGluMlpActivations>(base);
  const float* d_y = mlp_output_gradient(ctx, layout_, g, a.d_out, d_x_out, C_, true);
  const float* in = nullptr;
  parallel::GroupCollective in_gather;
  Linear* shared = a.swiglu.shared_input ? swiglu_.shared_input_owner() : nullptr;
  if (!g.defer)
    in_gather =
        regather(ctx, layout_, a.norm, g.regathered, g.rows, &in, shared, &a.swiglu.gate_saved);
  const std::function<void()> weight_halves = swiglu_.backward(ctx, a.swiglu, g, d_y, in);
  finish_input_projections(layout_, g, C_, in_gather, weight_halves);
  if (layout_.sharded() && shared != nullptr && !g.defer)
    Linear::release_prepared_input(a.swiglu.gate_saved);
  norm_.backward(ctx, layout_, a.norm, d_x, g.d_norm, x, g.local, d_x_out, g.norm_partials);
}

void SwiGluMlp::weight_pass(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows,
                            float* gathered) {
  auto& a = mlp_saved_as<SwiGluMlpActivations>(base);
  const float* in = nullptr;
  Linear* shared = a.swiglu.shared_input ? swiglu_.shared_input_owner() : nullptr;
  regather(ctx, layout_, a.norm, gathered, rows, &in, shared, &a.swiglu.gate_saved).wait();
  swiglu_.weight_pass(ctx, a.swiglu, a.d_out.f32(), in, rows);
  if (layout_.sharded() && shared != nullptr) Linear::release_prepared_input(a.swiglu.gate_saved);
  a.d_out.reset();
}

int64_t SwiGluMlp::norm_partial_floats() const {
  return (norm_.kind() == NormKind::layer_norm ? 2 : 1) * C_;
}

int64_t SwiGluMlp::saved_bytes(k::Precision precision, int64_t rows) const {
  // The norm's output: fp32, or in bf16 gate and up's shared input (this rank's rows of it in the
  // norm's out16 on a sharded layout).
  const bool shared = shares_input(precision);
  return layout_.local_rows(rows) * ((shared ? 2 : 4) * C_ + norm_.stats_bytes_per_row()) +
         swiglu_.saved_bytes(precision, rows, shared);
}

}  // namespace lattice::model
