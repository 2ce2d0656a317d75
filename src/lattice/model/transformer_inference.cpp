// Transformer incremental inference: the KV cache a model needs and the cached forward that runs
// only new tokens (see Transformer::make_kv_cache and Transformer::forward_cached in
// transformer.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/model/transformer.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

KvCache Transformer::make_kv_cache(int64_t batch, DeviceMemory& memory,
                                   MemoryTracker* tracker) const {
  check(has_embedding() && has_head(), "a KV cache needs the whole model, not a pipeline stage");
  // Under a sliding window W the cache rolls over 2W slots (W - 1 kept, W + 1 written between
  // moves); the positions still reach max_seq_len.
  const int64_t W = config_.sliding_window;
  const int64_t capacity = W > 0 ? std::min(config_.max_seq_len, 2 * W) : config_.max_seq_len;
  return KvCache(static_cast<int64_t>(blocks_.size()), batch, capacity, config_.n_kv_heads,
                 config_.head_dim(), memory, tracker, config_.value_head_dim(),
                 W > 0 ? std::min(W, capacity) : 0, config_.max_seq_len);
}

const float* Transformer::forward_cached(const LayerContext& ctx, KvCache& cache,
                                         const int32_t* tokens, int64_t B, int64_t n) {
  check(has_embedding() && has_head(), "forward_cached() needs the whole model");
  check(B > 0 && n > 0, "forward_cached() needs at least one new token per sequence");
  check(cache.layers() == static_cast<int64_t>(blocks_.size()) && cache.batch() == B &&
            cache.kv_heads() == config_.n_kv_heads && cache.head_dim() == config_.head_dim() &&
            cache.value_dim() == config_.value_head_dim() &&
            cache.capacity() <= config_.max_seq_len,
        "the KV cache does not fit this model and batch: make it with make_kv_cache(" +
            std::to_string(B) + ")");
  const int64_t start = cache.length();
  check(n <= cache.room(), "positions " + std::to_string(start) + ".." + std::to_string(start + n) +
                               " exceed the model's " + std::to_string(cache.max_positions()) +
                               " (model.max_seq_len): clear the cache and re-prefill a shorter "
                               "window");
  embedding_->check_tokens(tokens, B * n, "token");
  // A windowed cache takes a long prompt in pieces that fit its slots; the head runs on the last.
  const int64_t C = config_.d_model;
  int64_t piece = 0;
  for (int64_t done = 0; done < n; done += piece) {
    piece = std::min(n - done, cache.max_write());
    forward_cached_piece(ctx, cache, tokens, B, n, done, piece);
  }
  StageActivations& a = own_;
  HeadActivations& h = a.head;
  // Head on each sequence's last position only.
  ensure_activation(last_hidden_, {B, C}, ctx.ops.memory(), tracker_);
  ctx.ops.memory().copy_rows(last_hidden_.f32(), sizeof(float) * C,
                             a.residual.back().f32() + (piece - 1) * C, sizeof(float) * piece * C,
                             sizeof(float) * C, static_cast<size_t>(B), CopyKind::device_to_device);
  return head_->inference_logits(ctx, h, last_hidden_.f32(), B, tracker_);
}

void Transformer::forward_cached_piece(const LayerContext& ctx, KvCache& cache,
                                       const int32_t* tokens, int64_t B, int64_t n, int64_t first,
                                       int64_t count) {
  cache.make_room(count);
  const int64_t rows = B * count, C = config_.d_model, start = cache.length();
  // Tokens [first, first + count) of each of the B sequences of n, as a contiguous [B, count].
  std::vector<int32_t> piece(static_cast<size_t>(rows));
  for (int64_t b = 0; b < B; ++b)
    std::copy(tokens + b * n + first, tokens + b * n + first + count, piece.begin() + b * count);
  // The model's own activation set is the work space: no backward may follow.
  if (own_.blocks.size() != blocks_.size()) own_ = make_activations();
  StageActivations& a = own_;
  a.gradient_ready = false;
  a.residual.resize(blocks_.size() + 1);
  for (auto& r : a.residual) ensure_activation(r, {rows, C}, ctx.ops.memory(), tracker_);
  // Learned positions (GPT-2) are read from the absolute position `start` on.
  embedding_->forward(ctx, a.residual[0].f32(),
                      stage_ids(a.tokens, piece.data(), rows, ctx.ops.memory()), B, count, start);
  for (size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->forward_cached(ctx, *a.blocks[i], a.residual[i + 1].f32(), a.residual[i].f32(), B,
                               count, cache, static_cast<int64_t>(i));
  cache.advance(count);
}

}  // namespace lattice::model
