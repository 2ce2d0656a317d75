// Linear layer: see linear.hpp.
#include "lattice/model/linear.hpp"

namespace lattice::model {

Linear::Linear(ParameterStore& store, const std::string& prefix, int64_t in_features,
               int64_t out_features, bool bias, InitKind init)
    : store_(&store), in_(in_features), out_(out_features) {
  weight_ = store.declare(prefix + ".weight", {out_features, in_features}, init, true);
  if (bias) bias_ = store.declare(prefix + ".bias", {out_features}, InitKind::zeros, false);
}

void Linear::forward(const LayerContext& ctx, float* out, const float* in, int64_t rows) const {
  const float* bias = bias_ >= 0 ? store_->value(bias_) : nullptr;
  ctx.matmul.forward(out, in, store_->value(weight_), bias, rows, in_, out_, ctx.precision);
}

void Linear::backward(const LayerContext& ctx, float* d_in, const float* d_out, const float* in,
                      int64_t rows) const {
  float* d_bias = bias_ >= 0 ? store_->grad(bias_) : nullptr;
  ctx.matmul.backward(d_in, store_->grad(weight_), d_bias, d_out, in, store_->value(weight_), rows,
                      in_, out_, ctx.precision);
}

}  // namespace lattice::model
