// A LayerNorm or RMSNorm over rows: see norm.hpp.
#include "lattice/model/components/norm.hpp"

#include "lattice/core/error.hpp"
#include "lattice/model/block.hpp"

namespace lattice::model {

void NormActivations::release() {
  for (Tensor* t : {&out, &out16, &mean, &rstd}) t->reset();
}

Norm::Norm(ParameterStore& store, const std::string& name, NormKind kind, int64_t width, float eps)
    : store_(&store), kind_(kind), width_(width), eps_(eps) {
  weight_ = store.declare(name + ".weight", {width}, InitKind::ones, false);
  if (kind == NormKind::layer_norm)
    bias_ = store.declare(name + ".bias", {width}, InitKind::zeros, false);
}

void Norm::prepare(const LayerContext& ctx, NormActivations& a, int64_t rows, bool fp32_out,
                   bool bf16_out) const {
  if (fp32_out)
    ensure_activation(a.out, {rows, width_}, ctx);
  else
    a.out.reset();
  if (bf16_out)
    ensure_bf16_activation(a.out16, {rows, width_}, ctx);
  else
    a.out16.reset();
  if (kind_ == NormKind::layer_norm) ensure_activation(a.mean, {rows}, ctx);
  ensure_activation(a.rstd, {rows}, ctx);
}

void Norm::forward(const LayerContext& ctx, NormActivations& a, float* out, const float* x,
                   int64_t rows) const {
  const float* w = store_->value(weight_);
  if (kind_ == NormKind::layer_norm)
    ctx.ops.layernorm_forward(out, a.mean.f32(), a.rstd.f32(), x, w, store_->value(bias_), rows,
                              width_, eps_);
  else
    ctx.ops.rmsnorm_forward(out, a.rstd.f32(), x, w, rows, width_, eps_);
}

void Norm::forward_bf16(const LayerContext& ctx, NormActivations& a, lattice::bf16* out16,
                        const float* x, int64_t rows) const {
  if (kind_ == NormKind::layer_norm)
    ctx.ops.layernorm_forward_bf16(out16, a.mean.f32(), a.rstd.f32(), x, store_->value(weight_),
                                   store_->value(bias_), rows, width_, eps_);
  else
    ctx.ops.rmsnorm_forward_bf16(out16, a.rstd.f32(), x, store_->value(weight_), rows, width_,
                                 eps_);
}

void Norm::backward(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                    const NormActivations& a, float* d_x, const float* d_out, const float* x,
                    int64_t rows, const float* residual_grad, float* partials,
                    bool over_split_heads) const {
  const float* w = store_->value(weight_);
  if (kind_ == NormKind::layer_norm) {
    parallel::ReplicatedGradients grads(layout, ctx.ops,
                                        {store_->grad(weight_), store_->grad(bias_)}, width_,
                                        partials, over_split_heads);
    ctx.ops.layernorm_backward(d_x, grads.target(0), grads.target(1), d_out, x, w, a.mean.f32(),
                               a.rstd.f32(), rows, width_, residual_grad);
    grads.finish();
  } else {
    parallel::ReplicatedGradients grads(layout, ctx.ops, {store_->grad(weight_)}, width_, partials,
                                        over_split_heads);
    ctx.ops.rmsnorm_backward(d_x, grads.target(0), d_out, x, w, a.rstd.f32(), rows, width_,
                             residual_grad);
    grads.finish();
  }
}

}  // namespace lattice::model
