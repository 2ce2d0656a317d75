// The one transformer block type: see transformer_block.hpp.
#include "lattice/model/transformer_block.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

namespace k = lattice::kernels;
using parallel::ProjectionRole;

namespace {

// The MLP component a description names, its projections split as the plan says.
std::unique_ptr<FeedForward> make_mlp(ParameterStore& store, const BlockDescription& d,
                                      int64_t layer, const parallel::SequenceLayout& layout,
                                      const ExpertParallelGroup& ep) {
  const parallel::TensorSplit in = d.plan.split(ProjectionRole::mlp_input);
  const parallel::TensorSplit out = d.plan.split(ProjectionRole::mlp_output);
  if (const auto* gelu = std::get_if<GeluMlpDescription>(&d.mlp))
    return std::make_unique<GeluMlp>(store, d.prefix, *gelu, d.d_model, d.norm_eps, layout, in,
                                     out);
  if (const auto* swiglu = std::get_if<SwiGluMlpDescription>(&d.mlp))
    return std::make_unique<SwiGluMlp>(store, d.prefix, *swiglu, d.d_model, d.norm_eps, layout, in,
                                       out);
  check(d.plan.split(ProjectionRole::routed_experts) == parallel::TensorSplit::none,
        "a parallelize plan that splits the routed experts over tp is not supported: experts are "
        "split by expert parallelism (parallelism.ep)");
  return std::make_unique<MoeLayer>(store, d.prefix, std::get<MoeLayerDescription>(d.mlp),
                                    d.d_model, d.norm_eps, layer, layout, in, out, ep);
}

}  // namespace

void TransformerBlockActivations::release() {
  attention.release();
  if (mlp) mlp->release();
  x2.reset();
  weight_gradients_pending = false;
}

TransformerBlock::TransformerBlock(ParameterStore& store, const BlockDescription& d,
                                   int64_t layer_index, const parallel::SequenceLayout& layout,
                                   const k::RopeTable* rope, const ExpertParallelGroup& ep)
    : layout_(layout),
      C_(d.d_model),
      attention_(store, d.prefix, d.attention, d.d_model, d.norm_eps, layout,
                 d.plan.split(ProjectionRole::attention_input),
                 d.plan.split(ProjectionRole::attention_output), d.attention.rope ? rope : nullptr),
      mlp_(make_mlp(store, d, layer_index, layout, ep)) {}

std::unique_ptr<BlockActivations> TransformerBlock::make_activations() const {
  auto a = std::make_unique<Saved>();
  a->mlp = mlp_->make_activations();
  return a;
}

void TransformerBlock::prepare(const LayerContext& ctx, Saved& a, int64_t B, int64_t T,
                               bool cached) const {
  attention_.prepare(ctx, a.attention, B, T, cached);
  ensure_activation(a.x2, {layout_.local_rows(B * T), C_}, ctx);
  mlp_->prepare(ctx, *a.mlp, B * T);
}

void TransformerBlock::forward(const LayerContext& ctx, BlockActivations& saved, float* x_out,
                               const float* x_in, int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  prepare(ctx, a, B, T, /*cached=*/false);
  Tensor partial;  // a sharded layout's output projections' partial sums, [rows, C]
  attention_.forward(ctx, a.attention, a.x2.f32(), x_in, B, T, partial);
  mlp_->forward(ctx, *a.mlp, x_out, a.x2.f32(), B * T, partial, a.loss_scale);
  // Selective checkpointing: recomputed in backward.
  drop_recomputed_attention(a, a.attention.att, a.attention.lse);
}

void TransformerBlock::forward_cached(const LayerContext& ctx, BlockActivations& work, float* x_out,
                                      const float* x_in, int64_t B, int64_t n, KvCache& cache,
                                      int64_t cache_layer) {
  Saved& a = saved_as<Saved>(work);
  prepare(ctx, a, B, n, /*cached=*/true);
  Tensor partial;
  attention_.forward_cached(ctx, a.attention, a.x2.f32(), x_in, B, n, cache, cache_layer, partial);
  mlp_->forward(ctx, *a.mlp, x_out, a.x2.f32(), B * n, partial, 0.0f);
}

bool TransformerBlock::regathers_fp32(k::Precision precision) const {
  return layout_.sharded() &&
         (attention_.regathers_fp32(precision) || mlp_->regathers_fp32(precision));
}

void TransformerBlock::backward_pass(const LayerContext& ctx, BlockActivations& saved,
                                     float* d_x_in, const float* d_x_out, const float* x_in,
                                     int64_t B, int64_t T, BackwardScratch& scratch, bool defer) {
  Saved& a = saved_as<Saved>(saved);
  if (a.recompute_attention) attention_.recompute(ctx, a.attention, B, T);
  SublayerBackward g;
  g.B = B;
  g.T = T;
  g.rows = B * T;
  g.local = layout_.local_rows(g.rows);
  g.defer = defer;
  // The input projections run their halves apart when deferred, or on a group of several ranks
  // (their reduction then overlaps the weight halves).
  g.split = defer || layout_.ranks() > 1;
  g.scratch = &scratch;
  g.memory = &ctx.ops.memory();
  g.tracker = ctx.tracker;
  g.d_norm = g.get(slot::norm_gradient, g.local * C_);
  g.d_rows = layout_.sharded() ? g.get(slot::input_gradient_rows, g.rows * C_) : g.d_norm;
  if (regathers_fp32(ctx.precision)) g.regathered = g.get(slot::regathered_input, g.rows * C_);
  if (layout_.sharded())
    g.norm_partials = g.get(slot::norm_partials, std::max(attention_.norm_partial_floats(),
                                                          mlp_->norm_partial_floats()));
  float* d_x2 = attention_.output_gradient_buffer(g, a.attention);
  mlp_->backward(ctx, *a.mlp, g, d_x2, d_x_out, a.x2.f32());
  attention_.backward(ctx, a.attention, g, d_x_in, d_x2, x_in);
  if (!defer) drop_recomputed_attention(a, a.attention.att, a.attention.lse);
}

void TransformerBlock::weight_pass(const LayerContext& ctx, BlockActivations& saved,
                                   const float* x_in, int64_t B, int64_t T) {
  Saved& a = saved_as<Saved>(saved);
  (void)x_in;
  const int64_t rows = B * T;
  // The input projections' inputs over all rows: gathered again on a sharded layout (into a
  // transient fp32 buffer, or into the fused Linears' kept bf16 inputs), else the saved norm
  // outputs.
  Tensor gathered;
  if (regathers_fp32(ctx.precision)) ensure_activation(gathered, {2 * rows, C_}, ctx);
  float* buffer = gathered.empty() ? nullptr : gathered.f32();
  mlp_->weight_pass(ctx, *a.mlp, rows, buffer);
  attention_.weight_pass(ctx, a.attention, rows, buffer == nullptr ? nullptr : buffer + rows * C_);
  drop_recomputed_attention(a, a.attention.att, a.attention.lse);
}

int64_t TransformerBlock::saved_bytes(k::Precision precision, int64_t B, int64_t T) const {
  const int64_t rows = B * T;
  return attention_.saved_bytes(precision, B, T) + layout_.local_rows(rows) * 4 * C_ +
         mlp_->saved_bytes(precision, rows);
}

int64_t TransformerBlock::attention_output_bytes(int64_t B, int64_t T) const {
  return attention_.attention_output_bytes(B, T);
}

int64_t TransformerBlock::scratch_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // The shared slots — the norm's gradient and the residual gradient between the sub-layers
  // (this rank's rows), one input projection's input gradient before it is added; on a sharded
  // layout the gathered output gradient, the summed input gradient over all rows, the norm output
  // gathered again (fp32) and the norm weights' partial gradients — and each component's own.
  const int64_t rows = B * T, local = layout_.local_rows(rows);
  int64_t floats = 2 * local * C_;
  if (attention_.uses_projection_gradient() || mlp_->uses_projection_gradient())
    floats += rows * C_;
  if (layout_.sharded())
    floats += 2 * rows * C_ + (regathers_fp32(precision) ? rows * C_ : 0) +
              std::max(attention_.norm_partial_floats(), mlp_->norm_partial_floats());
  floats += attention_.scratch_floats(rows) + mlp_->scratch_floats(precision, rows);
  return 4 * floats;
}

int64_t TransformerBlock::transient_bytes(k::Precision precision, int64_t B, int64_t T) const {
  // The attention's gathered input, or the MLP's buffers beside the output projections' partial
  // sums (sharded layouts, fp32 [rows, C]), whichever is larger.
  const int64_t rows = B * T;
  const int64_t partial = layout_.sharded() ? 4 * rows * C_ : 0;
  return std::max(attention_.entry_transient_bytes(precision, rows),
                  partial + mlp_->transient_bytes(precision, rows));
}

int64_t TransformerBlock::pending_weight_bytes(k::Precision precision, int64_t B, int64_t T) const {
  const int64_t rows = B * T;
  return 4 *
         (attention_.pending_weight_floats(rows) + mlp_->pending_weight_floats(precision, rows));
}

std::optional<MoeLayerStatistics> TransformerBlock::moe_statistics(
    const BlockActivations& saved) const {
  const auto* a = dynamic_cast<const Saved*>(&saved);
  check(a != nullptr, "a block was handed another block type's activations (internal error)");
  return mlp_->moe_statistics(*a->mlp);
}

bool TransformerBlock::update_choice_bias(const std::vector<int64_t>& load, double rate) {
  return mlp_->update_choice_bias(load, rate);
}

}  // namespace lattice::model
