// KvCache: the keys and values every attention layer has computed for the tokens a model has seen
// so far, so that incremental inference runs only the new tokens (Transformer::forward_cached).
//
// Layout per layer: K [batch, capacity, kv_heads, head_dim] and V [batch, capacity, kv_heads,
// value_dim] (value_dim = head_dim but for value heads of their own width: DeepSeek's latent
// attention, whose cache holds the expanded keys and values), token-major. (The attention kernel
// reads keys and values as token rows of [heads, head_dim] with a row stride and a batch stride,
// so a cache in that layout is read in place: row stride kv_heads·head_dim, batch stride
// capacity·kv_heads·head_dim; the values' with value_dim.) The storage is counted as activations by
// the memory tracker.
//
// Without a window the cache holds positions [0, length()) in slots [0, length()). With a sliding
// window W (Mistral) a query never sees a key W or more positions back, so the cache keeps a buffer
// of `capacity` slots (make_kv_cache: 2W) over up to `max_positions` positions: when a write would
// not fit, make_room() moves the last W - 1 entries to the front and forgets the older ones (one
// copy of W - 1 rows every capacity - W + 1 tokens). Slots [0, stored()) then hold positions
// [first_position(), length()). The attention reads the slots in order with the window's mask,
// which counts back from the last key, so the dropped keys were masked out anyway.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/core/tensor.hpp"

namespace lattice::model {

class KvCache {
 public:
  // Storage for `layers` attention layers of `batch` sequences of up to `capacity` positions, in
  // `memory` (the backend's: kernels::Ops::memory()).
  // `value_dim` 0: head_dim. `window` 0: no sliding window (the cache holds `capacity` positions);
  // else the attention's window, at most `capacity`, and the cache rolls over up to `max_positions`
  // positions (0: capacity).
  KvCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
          DeviceMemory& memory, MemoryTracker* tracker = nullptr, int64_t value_dim = 0,
          int64_t window = 0, int64_t max_positions = 0);

  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t value_dim() const { return value_dim_; }
  int64_t window() const { return window_; }
  int64_t max_positions() const { return max_positions_; }
  // Number of positions seen (the same for every layer and sequence): the next token's position.
  int64_t length() const { return first_position_ + stored_; }
  // Positions still free before max_positions().
  int64_t room() const { return max_positions_ - length(); }
  // The entries held: slots [0, stored()) hold positions [first_position(), length()).
  int64_t stored() const { return stored_; }
  int64_t first_position() const { return first_position_; }
  // The most new positions one write can take after make_room(): all free slots, and with a window
  // also those of the entries older than the window's W - 1.
  int64_t max_write() const;
  // With a window: if `n` new positions do not fit in the free slots, keeps only the last W - 1
  // entries (moved to slots [0, W - 1)), which are all that the new positions' queries can see.
  // Without a window it changes nothing (write() refuses what does not fit).
  void make_room(int64_t n);
  // Bytes of key and value storage.
  int64_t bytes() const;

  // Elements between consecutive positions and between consecutive sequences.
  int64_t row_stride() const { return kv_heads_ * head_dim_; }
  int64_t batch_stride() const { return capacity_ * row_stride(); }
  // The same for the values.
  int64_t value_row_stride() const { return kv_heads_ * value_dim_; }
  int64_t value_batch_stride() const { return capacity_ * value_row_stride(); }
  const float* keys(int64_t layer) const;
  const float* values(int64_t layer) const;

  // Copies the keys and values of `n` new positions of each of `batch()` sequences into slots
  // [stored(), stored() + n) of `layer`. Source rows are [kv_heads·head_dim] with
  // `source_row_stride` elements between positions and n·source_row_stride between sequences
  // (the values' rows [kv_heads·value_dim] with `value_source_row_stride`, 0: the same stride).
  // length() moves only on advance(), once every layer has written.
  void write(int64_t layer, const float* new_keys, const float* new_values,
             int64_t source_row_stride, int64_t n, int64_t value_source_row_stride = 0);
  // Marks n more positions as filled.
  void advance(int64_t n);
  // Forgets every position (storage is kept).
  void clear() { first_position_ = stored_ = 0; }

 private:
  void check_layer(int64_t layer) const;
  // The entries a roll keeps (the last W - 1; without a window, all of them).
  int64_t entries_kept() const;
  // Slots a write may fill now: free slots, and no more than the positions left.
  int64_t free_slots() const;

  DeviceMemory* memory_;
  int64_t batch_, capacity_, kv_heads_, head_dim_, value_dim_, window_, max_positions_;
  int64_t first_position_ = 0, stored_ = 0;
  std::vector<Tensor> keys_, values_;
};

}  // namespace lattice::model
