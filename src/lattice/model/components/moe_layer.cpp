// The mixture-of-experts MLP sub-layer: see moe_layer.hpp.
#include "lattice/model/components/moe_layer.hpp"

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

void MoeLayerActivations::release() {
  FeedForwardActivations::release();
  shared.release();
  moe.release();
}

MoeLayer::MoeLayer(ParameterStore& store, const std::string& prefix, const MoeLayerDescription& d,
                   int64_t d_model, float norm_eps, int64_t layer_index,
                   const parallel::SequenceLayout& layout, parallel::TensorSplit input_split,
                   parallel::TensorSplit output_split, const ExpertParallelGroup& ep)
    : layout_(layout),
      norm_(store, prefix + d.norm, d.norm_kind, d_model, norm_eps),
      moe_(store, prefix + d.experts, d_model, d.expert_hidden, d.settings, d.names, ep),
      balancing_(d.balancing),
      C_(d_model),
      layer_(layer_index) {
  if (d.shared.hidden > 0)
    shared_ =
        SwiGluProjections(store, prefix, d.shared, d_model, layout, input_split, output_split);
}

std::unique_ptr<FeedForwardActivations> MoeLayer::make_activations() const {
  return std::make_unique<MoeLayerActivations>();
}

void MoeLayer::prepare(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows) const {
  auto& a = mlp_saved_as<MoeLayerActivations>(base);
  norm_.prepare(ctx, a.norm, layout_.local_rows(rows), true, false);
  if (dense()) shared_.prepare(ctx, a.shared, rows);
}

const float* MoeLayer::routed_input(const LayerContext& ctx, const MoeLayerActivations& a,
                                    Tensor& all_rows, int64_t rows) const {
  if (!layout_.sharded()) return a.norm.out.f32();
  ensure_activation(all_rows, {rows, C_}, ctx);
  layout_.gather(all_rows.f32(), a.norm.out.f32(), rows, C_);
  return all_rows.f32();
}

void MoeLayer::forward(const LayerContext& ctx, FeedForwardActivations& base, float* x_out,
                       const float* x, int64_t rows, Tensor& partial, float loss_scale) {
  auto& a = mlp_saved_as<MoeLayerActivations>(base);
  const int64_t local = layout_.local_rows(rows);
  if (dense()) {  // the shared experts, split as a dense MLP
    Tensor gathered;
    NormedRows in = normalize(ctx, layout_, norm_, a.norm, x, rows, gathered);
    shared_.forward(ctx, a.shared, in, gathered, x_out, rows, partial);
  } else {
    norm_.forward(ctx, a.norm, a.norm.out.f32(), x, local);
  }
  // The routed experts, on all rows (whole on every rank of the layout's group).
  Tensor all_rows, routed;
  const float* moe_in = routed_input(ctx, a, all_rows, rows);
  const bool separate = dense() || layout_.sharded();  // added to the shared experts', or own rows
  if (separate) ensure_activation(routed, {rows, C_}, ctx);
  float* out = separate ? routed.f32() : x_out;
  moe_.forward(ctx, a.moe, out, moe_in, rows);
  const float* own = out + layout_.first_own_row(rows) * C_;
  if (dense())
    ctx.ops.add_inplace(x_out, own, local * C_);
  else if (layout_.sharded())
    ctx.ops.copy(x_out, own, local * C_);
  // Training: the experts' loads over the balancing group (one small all-reduce per layer).
  comm::Communicator* group = ctx.balancing;
  if (group != nullptr && group->size() > 1 && loss_scale != 0.0f &&
      balancing_.aux_coefficient != 0) {
    std::vector<int64_t> load = a.moe.counts;
    group->allreduce(load.data(), static_cast<int64_t>(load.size()), DType::i64,
                     comm::ReduceOp::sum);
    a.losses = moe_balancing_losses(a.moe, rows, moe_.settings(), balancing_, loss_scale, &load,
                                    group->size());
  } else {
    a.losses = moe_balancing_losses(a.moe, rows, moe_.settings(), balancing_, loss_scale);
  }
  ctx.ops.add_inplace(x_out, x, local * C_);
}

void MoeLayer::backward(const LayerContext& ctx, FeedForwardActivations& base,
                        const SublayerBackward& g, float* d_x, const float* d_x_out,
                        const float* x) {
  auto& a = mlp_saved_as<MoeLayerActivations>(base);
  const int64_t rows = g.rows;
  const float* d_y = mlp_output_gradient(ctx, layout_, g, a.d_out, d_x_out, C_, dense());
  if (dense()) {
    const float* in = nullptr;
    parallel::GroupCollective in_gather;
    if (!g.defer) in_gather = regather(ctx, layout_, a.norm, g.regathered, rows, &in);
    const std::function<void()> weight_halves = shared_.backward(ctx, a.shared, g, d_y, in);
    finish_input_projections(layout_, g, C_, in_gather, weight_halves);
  }
  // The routed experts' whole backward, weights included, in either half.
  Tensor all_rows;  // sharded layouts: the norm output over all rows again
  const float* moe_in = routed_input(ctx, a, all_rows, rows);
  const bool separate = dense() || layout_.sharded();
  float* d_routed = separate ? g.get(slot::routed_gradient, rows * C_) : g.d_norm;
  moe_.backward(ctx, a.moe, d_routed, d_y, moe_in, rows, a.losses.gradients());
  const float* own = d_routed + layout_.first_own_row(rows) * C_;
  if (dense())
    ctx.ops.add_inplace(g.d_norm, own, g.local * C_);
  else if (layout_.sharded())
    ctx.ops.copy(g.d_norm, own, g.local * C_);
  norm_.backward(ctx, layout_, a.norm, d_x, g.d_norm, x, g.local, d_x_out, g.norm_partials);
}

void MoeLayer::weight_pass(const LayerContext& ctx, FeedForwardActivations& base, int64_t rows,
                           float* gathered) {
  // The routed experts ran their weight gradients in backward_input.
  if (!dense()) return;
  auto& a = mlp_saved_as<MoeLayerActivations>(base);
  const float* in = nullptr;
  regather(ctx, layout_, a.norm, gathered, rows, &in).wait();
  shared_.weight_pass(ctx, a.shared, a.d_out.f32(), in, rows);
  a.d_out.reset();
}

int64_t MoeLayer::norm_partial_floats() const {
  return (norm_.kind() == NormKind::layer_norm ? 2 : 1) * C_;
}

int64_t MoeLayer::saved_bytes(k::Precision precision, int64_t rows) const {
  return layout_.local_rows(rows) * (4 * C_ + norm_.stats_bytes_per_row()) +
         (dense() ? shared_.saved_bytes(precision, rows) : 0) + moe_.saved_bytes(rows);
}

int64_t MoeLayer::scratch_floats(k::Precision precision, int64_t rows) const {
  (void)precision;  // the shared experts' slots, and the routed input gradient kept apart
  return (dense() ? shared_.scratch_floats(rows) : 0) +
         (dense() || layout_.sharded() ? rows * C_ : 0);
}

int64_t MoeLayer::pending_weight_floats(k::Precision precision, int64_t rows) const {
  (void)precision;
  return dense() ? shared_.pending_weight_floats(rows) : 0;
}

int64_t MoeLayer::transient_bytes(k::Precision precision, int64_t rows) const {
  // The shared experts' gathered input, or the routed experts' backward buffers
  // (MoeMlp::transient_bytes) with their output before it is added and, on a sharded layout,
  // their input gathered.
  const int64_t routed =
      moe_.transient_bytes(rows) +
      4 * rows * C_ * ((dense() || layout_.sharded() ? 1 : 0) + (layout_.sharded() ? 1 : 0));
  return std::max(dense() ? shared_.entry_transient_bytes(precision, rows) : 0, routed);
}

std::optional<MoeLayerStatistics> MoeLayer::moe_statistics(
    const FeedForwardActivations& base) const {
  const auto* a = dynamic_cast<const MoeLayerActivations*>(&base);
  check(a != nullptr, "an MLP was handed another MLP kind's activations (internal error)");
  MoeLayerStatistics s;
  s.layer = layer_;
  s.tokens = a->moe.dispatch.tokens;
  s.copies = s.tokens * moe_.settings().top_k;
  s.dropped = a->moe.dispatch.dropped;
  s.counts = a->moe.counts;
  s.aux_loss = a->losses.aux;
  s.z_loss = a->losses.z;
  return s;
}

bool MoeLayer::update_choice_bias(const std::vector<int64_t>& load, double rate) {
  if (!moe_.settings().choice_bias) return false;
  moe_.update_choice_bias(load, rate);
  return true;
}

}  // namespace lattice::model
