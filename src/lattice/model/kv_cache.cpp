// KvCache: see kv_cache.hpp.
#include "lattice/model/kv_cache.hpp"

#include <string>

#include "lattice/core/error.hpp"

namespace lattice::model {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads,
                 int64_t head_dim, DeviceMemory& memory, MemoryTracker* tracker, int64_t value_dim)
    : memory_(&memory),
      batch_(batch),
      capacity_(capacity),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      value_dim_(value_dim > 0 ? value_dim : head_dim) {
  check(layers > 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0 && value_dim >= 0,
        "a KV cache needs positive layers, batch, capacity, kv_heads and head_dim");
  for (int64_t i = 0; i < layers; ++i) {
    keys_.emplace_back(Shape{batch, capacity, kv_heads, head_dim}, DType::f32, memory, tracker,
                       MemoryCategory::activations);
    values_.emplace_back(Shape{batch, capacity, kv_heads, value_dim_}, DType::f32, memory, tracker,
                         MemoryCategory::activations);
  }
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < keys_.size(); ++i)
    total += static_cast<int64_t>(keys_[i].nbytes() + values_[i].nbytes());
  return total;
}

void KvCache::check_layer(int64_t layer) const {
  check(layer >= 0 && layer < layers(), "KV cache layer " + std::to_string(layer) +
                                            " is outside [0, " + std::to_string(layers()) +
                                            "): the cache was made for another model");
}

const float* KvCache::keys(int64_t layer) const {
  check_layer(layer);
  return keys_[static_cast<size_t>(layer)].f32();
}

const float* KvCache::values(int64_t layer) const {
  check_layer(layer);
  return values_[static_cast<size_t>(layer)].f32();
}

void KvCache::write(int64_t layer, const float* new_keys, const float* new_values,
                    int64_t source_row_stride, int64_t n, int64_t value_source_row_stride) {
  check_layer(layer);
  check(n > 0 && n <= room(), "the KV cache has room for " + std::to_string(room()) + " of " +
                                  std::to_string(capacity_) + " positions, not " +
                                  std::to_string(n) + ": clear it and re-prefill a shorter window");
  // Per sequence, n token rows from the new keys' rows into positions length() .. + n.
  const int64_t row = row_stride(), value_row = value_row_stride();
  const int64_t value_stride =
      value_source_row_stride > 0 ? value_source_row_stride : source_row_stride;
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row);
  const size_t value_row_bytes = sizeof(float) * static_cast<size_t>(value_row);
  float* k_base = keys_[static_cast<size_t>(layer)].f32();
  float* v_base = values_[static_cast<size_t>(layer)].f32();
  for (int64_t b = 0; b < batch_; ++b) {
    memory_->copy_rows(k_base + b * batch_stride() + length_ * row, row_bytes,
                       new_keys + b * n * source_row_stride,
                       sizeof(float) * static_cast<size_t>(source_row_stride), row_bytes,
                       static_cast<size_t>(n), CopyKind::device_to_device);
    memory_->copy_rows(v_base + b * value_batch_stride() + length_ * value_row, value_row_bytes,
                       new_values + b * n * value_stride,
                       sizeof(float) * static_cast<size_t>(value_stride), value_row_bytes,
                       static_cast<size_t>(n), CopyKind::device_to_device);
  }
}

void KvCache::advance(int64_t n) {
  check(n >= 0 && n <= room(), "cannot advance the KV cache by " + std::to_string(n) +
                                   " positions: only " + std::to_string(room()) + " are free");
  length_ += n;
}

}  // namespace lattice::model
