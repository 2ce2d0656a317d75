// ParameterStore: see parameter_store.hpp.
#include "lattice/model/parameter_store.hpp"

#include <cmath>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"

namespace lattice::model {

int ParameterStore::declare(std::string name, Shape shape, InitKind init, bool weight_decay,
                            std::string init_stream) {
  check(values_.empty(), "parameter '" + name + "' declared after the store was allocated");
  check(!by_name_.contains(name), "parameter '" + name + "' declared twice");
  ParameterInfo info;
  info.name = std::move(name);
  info.numel = shape_numel(shape);
  info.shape = std::move(shape);
  info.offset = total_;
  info.init = init;
  info.weight_decay = weight_decay;
  info.init_stream = init_stream.empty() ? info.name : std::move(init_stream);
  // Keep every parameter 64-byte aligned inside the flat buffer (16 floats).
  total_ += (info.numel + 15) / 16 * 16;
  by_name_[info.name] = static_cast<int>(params_.size());
  params_.push_back(std::move(info));
  return static_cast<int>(params_.size()) - 1;
}

void ParameterStore::allocate(MemoryTracker* tracker) {
  values_ = Tensor({total_}, DType::f32, tracker, MemoryCategory::parameters);
  grads_ = Tensor({total_}, DType::f32, tracker, MemoryCategory::gradients);
}

float* ParameterStore::mutable_values() {
  ++values_version_;
  return values_.f32();
}

void ParameterStore::keep_bf16_copies(MemoryTracker* tracker) {
  check(allocated(), "ParameterStore::keep_bf16_copies before allocate() (internal error)");
  if (keeps_bf16_copies() || total_ == 0) return;
  bf16_values_ = Tensor({total_}, DType::bf16, tracker, MemoryCategory::parameters);
  bf16_versions_.assign(params_.size(), values_version_ - 1);  // stale: rounded on first use
}

const lattice::bf16* ParameterStore::bf16_value(int index) {
  if (!keeps_bf16_copies()) return nullptr;
  const ParameterInfo& p = info(index);
  lattice::bf16* copy = bf16_values_.data<lattice::bf16>() + p.offset;
  uint64_t& version = bf16_versions_[static_cast<size_t>(index)];
  if (version != values_version_) {
    kernels::convert_to_bf16(copy, values() + p.offset, p.numel);
    version = values_version_;
  }
  return copy;
}

void ParameterStore::bf16_copies_written() {
  for (uint64_t& version : bf16_versions_) version = values_version_;
}

void ParameterStore::zero_grads() {
  if (!grads_.empty()) kernels::zero_in_parallel(grads_.f32(), grads_.numel());
}

static uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void ParameterStore::initialize(uint64_t seed, float std, int64_t n_layers) {
  float* all = mutable_values();
  for (const auto& p : params_) {
    float* v = all + p.offset;
    Rng rng(fnv1a(p.init_stream, seed));
    float scale = std;
    switch (p.init) {
      case InitKind::zeros:
        for (int64_t i = 0; i < p.numel; ++i) v[i] = 0.0f;
        break;
      case InitKind::ones:
        for (int64_t i = 0; i < p.numel; ++i) v[i] = 1.0f;
        break;
      case InitKind::normal_residual:
        scale = std / std::sqrt(2.0f * static_cast<float>(n_layers));
        [[fallthrough]];
      case InitKind::normal:
        for (int64_t i = 0; i < p.numel; ++i) v[i] = rng.normal() * scale;
        break;
    }
  }
}

int ParameterStore::index_of(const std::string& name) const {
  auto it = by_name_.find(name);
  check(it != by_name_.end(), "no parameter named '" + name + "' in this model");
  return it->second;
}

}  // namespace lattice::model
