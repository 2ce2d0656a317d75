// The GELU MLP sub-layer: see gelu_mlp.hpp.
#include "lattice/model/components/gelu_mlp.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

void GeluMlpActivations::release() {
  FeedForwardActivations::release();
  for (Tensor* t : {&fc, &gelu, &slope16, &d_fc}) t->reset();
  fc_saved.release();
  proj_saved.release();
}

GeluMlp::GeluMlp(ParameterStore& store, const std::string& prefix, const GeluMlpDescription& d,
                 int64_t d_model, float norm_eps, const parallel::SequenceLayout& layout,
                 parallel::TensorSplit fc_split, parallel::TensorSplit proj_split)
    : layout_(layout), C_(d_model) {
  check(d.hidden % layout.ranks() == 0,
        "parallelism.tp = " + std::to_string(layout.ranks()) + " must divide the MLP width " +
            std::to_string(d.hidden) + ": pick a tp that divides it");
  norm_ = Norm(store, prefix + d.norm, d.norm_kind, C_, norm_eps);
  fc_ =
      Linear(store, prefix + d.fc, C_, d.hidden, d.bias, InitKind::normal, layout.split(fc_split));
  proj_ = Linear(store, prefix + d.proj, d.hidden, C_, d.bias, InitKind::normal_residual,
                 layout.split(proj_split));
  F_ = fc_.out_features();
}

std::unique_ptr<FeedForwardActivations> GeluMlp::make_activations() const {
  return std::make_unique<GeluMlpActivations>();
}

void GeluMlp::prepare(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows) const {
  auto& a = mlp_saved_as<GeluMlpActivations>(base);
  const bool fused = this->fused(ctx.precision);
  norm_.prepare(ctx, a.norm, layout_.local_rows(rows), !fused, fused && layout_.sharded());
  // Fused: the GELU output exists only as proj's bf16 input, and backward keeps the GELU's bf16
  // slope instead of the fp32 pre-activation, which the backend never stores.
  if (fused) {
    a.gelu.reset();
    a.fc.reset();
    ensure_bf16_activation(a.slope16, {rows, F_}, ctx);
  } else {
    a.slope16.reset();
    ensure_activation(a.fc, {rows, F_}, ctx);
    ensure_activation(a.gelu, {rows, F_}, ctx);
  }
}

void GeluMlp::forward(const LayerContext& ctx, FeedForwardActivations& base, float* x_out,
                      const float* x, int64_t rows, Tensor& partial, float loss_scale) {
  (void)loss_scale;
  auto& a = mlp_saved_as<GeluMlpActivations>(base);
  const bool fused = this->fused(ctx.precision);
  {
    Tensor gathered;
    NormedRows in = normalize(ctx, layout_, norm_, a.norm, x, rows, gathered,
                              fused ? &fc_ : nullptr, &a.fc_saved);
    if (fused) {
      // fc and the GELU in one op on the norm's bf16 output, written as proj's bf16 input.
      lattice::bf16* gelu16 = proj_.prepare_bf16_input(ctx, a.proj_saved, rows);
      layout_.forward_gathered(
          in.gather,
          [&](int64_t first, int64_t count, bool own) {
            fc_.forward_prepared_gelu_bf16_rows(ctx, a.fc_saved, gelu16,
                                                a.slope16.data<lattice::bf16>(), rows, first, count,
                                                own ? in.own16 : nullptr);
          },
          rows);
      if (layout_.sharded()) Linear::release_prepared_input(a.fc_saved);
    } else {
      layout_.forward_gathered(
          in.gather,
          [&](int64_t first, int64_t count, bool own) {
            if (own)
              fc_.forward_piece(ctx, a.fc_saved, a.fc.f32() + first * F_, in.own, rows, first,
                                count);
            else
              fc_.forward_rows(ctx, a.fc_saved, a.fc.f32(), in.all, rows, first, count);
          },
          rows);
      if (layout_.sharded()) a.fc_saved.release();
    }
  }
  if (!fused) ctx.ops.gelu_forward(a.gelu.f32(), a.fc.f32(), rows * F_);
  output_projection_forward(
      ctx, layout_, x_out, rows, C_, partial, [&](float* out, int64_t first, int64_t count) {
        if (fused)
          proj_.forward_prepared_rows(ctx, a.proj_saved, out, rows, first, count);
        else
          proj_.forward_rows(ctx, a.proj_saved, out, a.gelu.f32(), rows, first, count);
      });
  ctx.ops.add_inplace(x_out, x, layout_.local_rows(rows) * C_);
}

void GeluMlp::backward(const LayerContext& ctx, FeedForwardActivations& base,
                       const SublayerBackward& g, float* d_x, const float* d_x_out,
                       const float* x) {
  auto& a = mlp_saved_as<GeluMlpActivations>(base);
  const int64_t rows = g.rows;
  const bool fused = this->fused(ctx.precision);
  const float* d_y = mlp_output_gradient(ctx, layout_, g, a.d_out, d_x_out, C_, !fused);
  const float* in = nullptr;  // fc's fp32 input over all rows (not in the fused path)
  parallel::GroupCollective in_gather;
  if (!g.defer)
    in_gather = regather(ctx, layout_, a.norm, g.regathered, rows, &in, fused ? &fc_ : nullptr,
                         &a.fc_saved);
  float* d_fc = g.kept(a.d_fc, slot::mlp_input_gradient, rows * F_);  // fused: bf16 in its half
  auto* d_fc16 = reinterpret_cast<lattice::bf16*>(d_fc);
  if (fused) {
    // proj's d_out rounded once (with its bias gradient) for its weight gradient and for d_gelu.
    auto* d_y16 = reinterpret_cast<lattice::bf16*>(
        g.kept(a.d_out, slot::mlp_hidden_gradient, (rows * C_ + 1) / 2));
    ctx.ops.round_with_column_sums(d_y16, proj_.bias_grad(), d_y, rows, C_);
    if (!g.defer) proj_.backward_rounded(ctx, a.proj_saved, nullptr, d_y16, nullptr, rows);
    // d_gelu = d_y · W_proj taken through the GELU backward into fc's bf16 d_out (with fc's bias
    // gradient): the fp32 d_gelu is never stored.
    proj_.backward_input_through_gelu_bf16(ctx, d_fc16, fc_.bias_grad(), d_y16,
                                           a.slope16.data<lattice::bf16>(), rows);
    if (g.split)
      fc_.backward_input_rounded(ctx, g.d_rows, d_fc16, rows);
    else
      fc_.backward_rounded(ctx, a.fc_saved, g.d_rows, d_fc16, nullptr, rows);
  } else {
    float* d_gelu = g.get(slot::mlp_hidden_gradient, rows * F_);
    output_projection_backward(ctx, g, proj_, a.proj_saved, d_gelu, d_y, a.gelu.f32());
    ctx.ops.gelu_backward(d_fc, d_gelu, a.fc.f32(), rows * F_);
    input_projection_backward(ctx, g, fc_, a.fc_saved, g.d_rows, d_fc, in);
  }
  finish_input_projections(layout_, g, C_, in_gather, [&] {
    if (fused)
      fc_.backward_rounded(ctx, a.fc_saved, nullptr, d_fc16, nullptr, rows);
    else
      fc_.backward_weight(ctx, a.fc_saved, d_fc, in, rows);
  });
  if (layout_.sharded() && fused && !g.defer) Linear::release_prepared_input(a.fc_saved);
  norm_.backward(ctx, layout_, a.norm, d_x, g.d_norm, x, g.local, d_x_out, g.norm_partials);
}

void GeluMlp::weight_pass(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows,
                          float* gathered) {
  auto& a = mlp_saved_as<GeluMlpActivations>(base);
  const bool fused = this->fused(ctx.precision);
  const float* in = nullptr;
  regather(ctx, layout_, a.norm, gathered, rows, &in, fused ? &fc_ : nullptr, &a.fc_saved).wait();
  if (fused) {
    proj_.backward_rounded(ctx, a.proj_saved, nullptr,
                           reinterpret_cast<const lattice::bf16*>(a.d_out.f32()), nullptr, rows);
    fc_.backward_rounded(ctx, a.fc_saved, nullptr,
                         reinterpret_cast<const lattice::bf16*>(a.d_fc.f32()), nullptr, rows);
    if (layout_.sharded()) Linear::release_prepared_input(a.fc_saved);
  } else {
    proj_.backward_weight(ctx, a.proj_saved, a.d_out.f32(), a.gelu.f32(), rows);
    fc_.backward_weight(ctx, a.fc_saved, a.d_fc.f32(), in, rows);
  }
  a.d_out.reset();
  a.d_fc.reset();
}

int64_t GeluMlp::norm_partial_floats() const {
  return (norm_.kind() == NormKind::layer_norm ? 2 : 1) * C_;
}

int64_t GeluMlp::saved_bytes(k::Precision precision, int64_t rows) const {
  // The norm's output and statistics on this rank's rows; fp32: the pre-activation and the GELU;
  // fused bf16: the norm's bf16 output, the GELU's bf16 slope and proj's bf16 input.
  const int64_t local = layout_.local_rows(rows), stats = norm_.stats_bytes_per_row();
  if (fused(precision)) return local * (2 * C_ + stats) + rows * (2 * F_ + 2 * F_);
  int64_t bytes = local * (4 * C_ + stats) + rows * 4 * 2 * F_;
  if (precision == k::Precision::bf16)  // proj's and fc's kept bf16 inputs
    bytes += rows * 2 * F_ + (layout_.sharded() ? 0 : rows * 2 * C_);
  return bytes;
}

int64_t GeluMlp::scratch_floats(k::Precision precision, int64_t rows) const {
  // d_gelu (fused: proj's rounded d_out in half as many floats) and fc's d_out.
  return (fused(precision) ? (rows * C_ + 1) / 2 : rows * F_) + rows * F_;
}

int64_t GeluMlp::pending_weight_floats(k::Precision precision, int64_t rows) const {
  // proj's d_out (fused: rounded, half the floats) and fc's.
  return (fused(precision) ? (rows * C_ + 1) / 2 : rows * C_) + rows * F_;
}

int64_t GeluMlp::transient_bytes(k::Precision precision, int64_t rows) const {
  // Sharded layouts: fc's input gathered (fp32, or bf16 in its prepared input, freed after the
  // GEMM; without the fused paths in bf16 also its rounding).
  if (!layout_.sharded()) return 0;
  if (fused(precision)) return rows * C_ * 2;
  return rows * C_ * (4 + (precision == k::Precision::bf16 ? 2 : 0));
}

}  // namespace lattice::model
