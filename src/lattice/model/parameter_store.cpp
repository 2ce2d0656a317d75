// ParameterStore: see parameter_store.hpp.
#include "lattice/model/parameter_store.hpp"

#include <algorithm>
#include <cmath>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"

namespace lattice::model {

int ParameterStore::declare(std::string name, Shape shape, InitKind init, bool weight_decay,
                            std::string init_stream) {
  Shape global = shape;
  return declare_shard(std::move(name), std::move(global), TensorShard{}, mesh::AxisSet::all(),
                       init, weight_decay, std::move(init_stream));
}

int ParameterStore::declare_shard(std::string name, Shape global_shape, TensorShard shard,
                                  mesh::AxisSet replicated, InitKind init, bool weight_decay,
                                  std::string init_stream) {
  check(values_.empty(), "parameter '" + name + "' declared after the store was allocated");
  check(!by_name_.contains(name), "parameter '" + name + "' declared twice");
  check(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count,
        "parameter '" + name + "': shard " + std::to_string(shard.index) + " of " +
            std::to_string(shard.count) + " is not a slice (internal error)");
  Shape local = global_shape;
  if (!shard.whole()) {
    check(shard.dim >= 0 && shard.dim < static_cast<int>(global_shape.size()),
          "parameter '" + name + "': shard dimension " + std::to_string(shard.dim) +
              " is not a dimension of its shape (internal error)");
    const int64_t logical_extent = global_shape[static_cast<size_t>(shard.dim)];
    check(shard.padded == 0 ||
              (shard.dim == 0 && shard.blocks == 1 && shard.padded >= logical_extent),
          "parameter '" + name +
              "': padding applies to dimension 0 of an unblocked shard, to an "
              "extent no smaller than the logical one (internal error)");
    const int64_t extent = shard.padded > 0 ? shard.padded : logical_extent;
    check(shard.blocks >= 1 && extent % (int64_t{shard.count} * shard.blocks) == 0,
          "parameter '" + name + "': dimension " + std::to_string(shard.dim) + " (" +
              std::to_string(extent) + ") does not split into " + std::to_string(shard.count) +
              " equal shards" +
              (shard.blocks > 1 ? " of each of its " + std::to_string(shard.blocks) + " blocks"
                                : std::string()) +
              ": choose a size it divides");
    local[static_cast<size_t>(shard.dim)] = extent / shard.count;
  } else {
    shard = TensorShard{};
  }
  ParameterInfo info;
  info.name = std::move(name);
  info.numel = shape_numel(local);
  info.shape = std::move(local);
  info.global_shape = std::move(global_shape);
  info.shard = shard;
  info.replicated = replicated;
  info.offset = total_;
  info.init = init;
  info.weight_decay = weight_decay;
  info.init_stream = init_stream.empty() ? info.name : std::move(init_stream);
  total_ += aligned_extent(info.numel);
  by_name_[info.name] = static_cast<int>(params_.size());
  params_.push_back(std::move(info));
  return static_cast<int>(params_.size()) - 1;
}

void ParameterStore::hold_along(mesh::Axis axis) {
  check(values_.empty(), "parameter placements changed after the store was allocated");
  for (ParameterInfo& p : params_) p.replicated = p.replicated.without(axis);
}

void ParameterStore::place_last(mesh::Axis axis) {
  check(values_.empty(), "parameter layout changed after the store was allocated");
  total_ = 0;
  for (bool trailing : {false, true}) {
    if (trailing) trailing_offset_ = total_;
    for (ParameterInfo& p : params_) {
      if (p.replicated.contains(axis) == trailing) continue;
      p.offset = total_;
      total_ += aligned_extent(p.numel);
    }
  }
}

void ParameterStore::allocate(MemoryTracker* tracker, DeviceMemory& memory) {
  values_ = Tensor({total_}, DType::f32, memory, tracker, MemoryCategory::parameters);
  grads_ = Tensor({total_}, DType::f32, memory, tracker, MemoryCategory::gradients);
}

float* ParameterStore::mutable_values() {
  ++values_version_;
  return values_.f32();
}

void ParameterStore::keep_bf16_copies(MemoryTracker* tracker) {
  check(allocated(), "ParameterStore::keep_bf16_copies before allocate() (internal error)");
  if (keeps_bf16_copies() || total_ == 0) return;
  bf16_values_ =
      Tensor({total_}, DType::bf16, values_.memory(), tracker, MemoryCategory::parameters);
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

SliceWalk slice_walk(const ParameterInfo& p) {
  SliceWalk w;
  if (p.shard.whole()) {
    w.run = w.stride = p.numel;
    return w;
  }
  const auto dim = static_cast<size_t>(p.shard.dim);
  int64_t inner = 1;
  for (size_t d = dim + 1; d < p.global_shape.size(); ++d) inner *= p.global_shape[d];
  for (size_t d = 0; d < dim; ++d) w.outer *= p.global_shape[d];
  // Each of the dimension's blocks holds one run of this slice (one block: the whole dimension).
  w.outer *= p.shard.blocks;
  w.run = p.shape[dim] / p.shard.blocks * inner;
  w.stride = p.global_shape[dim] / p.shard.blocks * inner;
  w.first = p.shard.index * w.run;
  if (p.shard.padded > 0) {  // dimension 0: the slice's rows that lie inside the logical extent
    const int64_t rows =
        std::clamp<int64_t>(p.global_shape[0] - p.shard.index * p.shape[0], 0, p.shape[0]);
    w.run = rows * inner;
    w.stride = p.global_shape[0] * inner;
  }
  return w;
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
      case InitKind::normal: {
        if (p.shard.whole()) {
          for (int64_t i = 0; i < p.numel; ++i) v[i] = rng.normal() * scale;
          break;
        }
        // A shard: the whole parameter's sequence of draws, keeping this slice's elements.
        const SliceWalk w = slice_walk(p);
        int64_t logical = 0;
        for (int64_t o = 0; o < w.outer; ++o) {
          const int64_t begin = o * w.stride + w.first;
          for (; logical < begin; ++logical) {  // a skipped draw: normal() takes two words
            rng.next_u64();
            rng.next_u64();
          }
          for (int64_t i = 0; i < w.run; ++i, ++logical) *v++ = rng.normal() * scale;
        }
        break;
      }
    }
  }
}

int ParameterStore::index_of(const std::string& name) const {
  auto it = by_name_.find(name);
  check(it != by_name_.end(), "no parameter named '" + name + "' in this model");
  return it->second;
}

}  // namespace lattice::model
