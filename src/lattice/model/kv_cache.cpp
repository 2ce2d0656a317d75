// KvCache: see kv_cache.hpp.
#include "lattice/model/kv_cache.hpp"

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::model {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads,
                 int64_t head_dim, DeviceMemory& memory, MemoryTracker* tracker, int64_t value_dim,
                 int64_t window, int64_t max_positions)
    : memory_(&memory),
      batch_(batch),
      capacity_(capacity),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      value_dim_(value_dim > 0 ? value_dim : head_dim),
      window_(window),
      max_positions_(max_positions > 0 ? max_positions : capacity) {
  check(layers > 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0 && value_dim >= 0,
        "a KV cache needs positive layers, batch, capacity, kv_heads and head_dim");
  check(window >= 0 && window <= capacity, "a KV cache's window (" + std::to_string(window) +
                                               ") must be 0 or at most its capacity (" +
                                               std::to_string(capacity) + " slots)");
  check(max_positions_ >= capacity && (window > 0 || max_positions_ == capacity),
        "a KV cache holds more positions (" + std::to_string(max_positions_) + ") than slots (" +
            std::to_string(capacity) + ") only under a sliding window");
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

int64_t KvCache::entries_kept() const {
  return window_ > 0 ? std::min(stored_, window_ - 1) : stored_;
}

int64_t KvCache::free_slots() const {
  return std::min(capacity_ - stored_, room());
}

int64_t KvCache::max_write() const {
  return capacity_ - entries_kept();
}

void KvCache::make_room(int64_t n) {
  const int64_t kept = entries_kept(), dropped = stored_ - kept;
  // Nothing to move: room enough, or no entry older than the window (no window: none is dropped;
  // write() refuses what does not fit).
  if (n <= capacity_ - stored_ || dropped == 0) return;
  // Slots [dropped, stored) to [0, kept), in blocks of `dropped` rows: each block's source and
  // destination are disjoint, and every source is read before a later block overwrites it.
  for (size_t layer = 0; layer < keys_.size(); ++layer) {
    float* k_base = keys_[layer].f32();
    float* v_base = values_[layer].f32();
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t slot = 0; slot < kept; slot += dropped) {
        const auto rows = static_cast<size_t>(std::min(dropped, kept - slot));
        float* k = k_base + b * batch_stride();
        float* v = v_base + b * value_batch_stride();
        memory_->copy(k + slot * row_stride(), k + (slot + dropped) * row_stride(),
                      rows * sizeof(float) * static_cast<size_t>(row_stride()),
                      CopyKind::device_to_device);
        memory_->copy(v + slot * value_row_stride(), v + (slot + dropped) * value_row_stride(),
                      rows * sizeof(float) * static_cast<size_t>(value_row_stride()),
                      CopyKind::device_to_device);
      }
  }
  first_position_ += dropped;
  stored_ = kept;
}

void KvCache::write(int64_t layer, const float* new_keys, const float* new_values,
                    int64_t source_row_stride, int64_t n, int64_t value_source_row_stride) {
  check_layer(layer);
  check(n > 0 && n <= free_slots(), "the KV cache has room for " + std::to_string(free_slots()) +
                                        " of " + std::to_string(capacity_) + " positions, not " +
                                        std::to_string(n) +
                                        ": clear it and re-prefill a shorter window");
  // Per sequence, n token rows from the new keys' rows into slots stored() .. + n.
  const int64_t row = row_stride(), value_row = value_row_stride();
  const int64_t value_stride =
      value_source_row_stride > 0 ? value_source_row_stride : source_row_stride;
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row);
  const size_t value_row_bytes = sizeof(float) * static_cast<size_t>(value_row);
  float* k_base = keys_[static_cast<size_t>(layer)].f32();
  float* v_base = values_[static_cast<size_t>(layer)].f32();
  for (int64_t b = 0; b < batch_; ++b) {
    memory_->copy_rows(k_base + b * batch_stride() + stored_ * row, row_bytes,
                       new_keys + b * n * source_row_stride,
                       sizeof(float) * static_cast<size_t>(source_row_stride), row_bytes,
                       static_cast<size_t>(n), CopyKind::device_to_device);
    memory_->copy_rows(v_base + b * value_batch_stride() + stored_ * value_row, value_row_bytes,
                       new_values + b * n * value_stride,
                       sizeof(float) * static_cast<size_t>(value_stride), value_row_bytes,
                       static_cast<size_t>(n), CopyKind::device_to_device);
  }
}

void KvCache::advance(int64_t n) {
  check(n >= 0 && n <= free_slots(), "cannot advance the KV cache by " + std::to_string(n) +
                                         " positions: only " + std::to_string(free_slots()) +
                                         " are free");
  stored_ += n;
}

}  // namespace lattice::model
