// Linear layer y = x·Wᵀ + b over rows of tokens, with W stored [out, in] in the ParameterStore
// under
// "<prefix>.weight" (and "<prefix>.bias").
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::model {

class Linear {
 public:
  Linear() = default;
  Linear(ParameterStore& store, const std::string& prefix, int64_t in_features,
         int64_t out_features, bool bias, InitKind init);

  void forward(const LayerContext& ctx, float* out, const float* in, int64_t rows) const;
  // d_in overwritten (skipped when null); weight and bias gradients accumulate.
  void backward(const LayerContext& ctx, float* d_in, const float* d_out, const float* in,
                int64_t rows) const;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  ParameterStore* store_ = nullptr;
  int weight_ = -1, bias_ = -1;
  int64_t in_ = 0, out_ = 0;
};

}  // namespace lattice::model
