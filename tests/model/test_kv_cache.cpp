// Tests of incremental inference: the KV cache's layout, memory accounting and rolling under a
// sliding window, and
// Transformer::forward_cached (prefill, then one token at a time, chunks, a cleared and
// re-prefilled window) against the logits of the full-sequence forward, Transformer::logits, for
// GPT-2, Llama with grouped-query attention, Mistral's window, Qwen 3's q/k norms and DeepSeek-V3's
// latent attention (its expanded keys and values of their own widths).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/kv_cache.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

// gpt2-tiny, llama-tiny (4 query heads over 2 KV heads: grouped-query attention), mistral-tiny (its
// sliding window of 8: cached queries see only the window's keys) and qwen3-tiny (q/k norms on
// heads of 16 over a 32-wide model), max_seq_len 32, vocabulary 64, with larger weights than
// GPT-2's 0.02 so that every position matters.
ModelConfig tiny(Family family) {
  ModelConfig c =
      model_preset(family == Family::deepseek ? "deepseek-v3-tiny" : family_name(family) + "-tiny");
  c.init_std = 0.2f;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return tokens;
}

// tokens[b, t0:t1) of a row-major [B, T] array, as a contiguous [B, t1 - t0] array.
std::vector<int32_t> columns(const std::vector<int32_t>& tokens, int64_t B, int64_t T, int64_t t0,
                             int64_t t1) {
  std::vector<int32_t> out;
  for (int64_t b = 0; b < B; ++b)
    out.insert(out.end(), tokens.begin() + b * T + t0, tokens.begin() + b * T + t1);
  return out;
}

// The reference: logits of position t1 - 1 of each sequence from the full forward over
// tokens[:, t0:t1) (positions 0 .. t1 - t0 - 1), [B, vocab].
std::vector<float> full_forward_last(Transformer& model, const LayerContext& ctx,
                                     const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                                     int64_t t0, int64_t t1) {
  const std::vector<int32_t> window = columns(tokens, B, T, t0, t1);
  const int64_t n = t1 - t0, V = model.config().vocab_size;
  const float* logits = model.logits(ctx, window.data(), B, n);
  std::vector<float> last;
  for (int64_t b = 0; b < B; ++b)
    last.insert(last.end(), logits + ((b + 1) * n - 1) * V, logits + (b + 1) * n * V);
  return last;
}

// Cached logits must equal the full forward's up to fp32 rounding, not bit for bit: each row's
// arithmetic is the same, but the GEMMs (oneDNN sgemm) choose their blocking, and with it the order
// of each dot product's sums, from the number of rows (1 new token, or only the last position for
// the head, against all T rows). Observed: at most 1.3e-6 of the logits' largest magnitude; a wrong
// position or a missing key changes logits by O(1).
constexpr double kRelativeTolerance = 1e-5;

void expect_close(const float* cached, const std::vector<float>& reference, const char* what) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(cached[i]) - reference[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(reference[i])));
  }
  ASSERT_GT(max_ref, 0.1) << what;  // logits that are not all ~0
  EXPECT_LE(max_diff, kRelativeTolerance * max_ref) << what << ": max |diff| " << max_diff;
}

}  // namespace

TEST(KvCache, LaysOutTokenRowsAndCountsItsMemory) {
  MemoryTracker tracker;
  const int64_t layers = 2, B = 2, capacity = 8, kv_heads = 2, head_dim = 4;
  KvCache cache(layers, B, capacity, kv_heads, head_dim, host_memory(), &tracker);
  const int64_t bytes = 2 * layers * B * capacity * kv_heads * head_dim * 4;
  EXPECT_EQ(cache.bytes(), bytes);
  EXPECT_EQ(tracker.current(MemoryCategory::activations), bytes);
  EXPECT_EQ(cache.row_stride(), kv_heads * head_dim);
  EXPECT_EQ(cache.batch_stride(), capacity * kv_heads * head_dim);

  // Two writes of 3 then 2 positions, from sources with 2 padding elements per row.
  const int64_t row = kv_heads * head_dim, source_stride = row + 2;
  for (int64_t n : {3, 2}) {
    std::vector<float> k(static_cast<size_t>(B * n * source_stride)), v(k.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < row; ++j) {
          const float position = static_cast<float>(cache.length() + t);
          k[static_cast<size_t>((b * n + t) * source_stride + j)] = 1000 * b + 10 * position + j;
          v[static_cast<size_t>((b * n + t) * source_stride + j)] = -(1000 * b + 10 * position + j);
        }
    for (int64_t layer = 0; layer < layers; ++layer)
      cache.write(layer, k.data(), v.data(), source_stride, n);
    EXPECT_EQ(cache.length(), n == 3 ? 0 : 3);  // length moves on advance() only
    cache.advance(n);
  }
  EXPECT_EQ(cache.length(), 5);
  EXPECT_EQ(cache.room(), 3);
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < 5; ++t)
        for (int64_t j = 0; j < row; ++j) {
          const int64_t at = b * cache.batch_stride() + t * row + j;
          ASSERT_EQ(cache.keys(layer)[at], 1000 * b + 10 * t + j);
          ASSERT_EQ(cache.values(layer)[at], -(1000 * b + 10 * t + j));
        }
  std::vector<float> four(static_cast<size_t>(B * 4 * row));
  EXPECT_THROW(cache.write(0, four.data(), four.data(), row, 4), Error);  // 3 free, not 4
  EXPECT_THROW(cache.advance(4), Error);
  EXPECT_THROW(cache.keys(2), Error);
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.room(), capacity);
}

TEST(KvCache, HoldsValueHeadsOfTheirOwnWidth) {
  // DeepSeek's latent attention caches its expanded keys (qk wide) and values (v wide): the values
  // are rows of kv_heads x value_dim, with a source stride of their own.
  const int64_t B = 2, capacity = 4, kv_heads = 2, head_dim = 6, value_dim = 3, n = 3;
  KvCache cache(1, B, capacity, kv_heads, head_dim, host_memory(), nullptr, value_dim);
  EXPECT_EQ(cache.value_dim(), value_dim);
  EXPECT_EQ(cache.bytes(), B * capacity * kv_heads * (head_dim + value_dim) * 4);
  EXPECT_EQ(cache.value_row_stride(), kv_heads * value_dim);
  EXPECT_EQ(cache.value_batch_stride(), capacity * kv_heads * value_dim);
  const int64_t k_row = kv_heads * head_dim, v_row = kv_heads * value_dim;
  std::vector<float> k(static_cast<size_t>(B * n * k_row)), v(static_cast<size_t>(B * n * v_row));
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = -static_cast<float>(i);
  cache.write(0, k.data(), v.data(), k_row, n, v_row);
  cache.advance(n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k_row; ++j)
        ASSERT_EQ(cache.keys(0)[b * cache.batch_stride() + t * k_row + j],
                  k[static_cast<size_t>((b * n + t) * k_row + j)]);
      for (int64_t j = 0; j < v_row; ++j)
        ASSERT_EQ(cache.values(0)[b * cache.value_batch_stride() + t * v_row + j],
                  v[static_cast<size_t>((b * n + t) * v_row + j)]);
    }
}

// A sliding window of 4 over 6 slots and up to 20 positions: when 3 new positions do not fit, the
// last 3 entries (all that a window of 4 lets the new queries see) move to the front, the older
// ones are forgotten, and the positions go on counting.
TEST(KvCache, UnderAWindowKeepsTheLastEntriesAndRolls) {
  const int64_t B = 2, capacity = 6, window = 4, max_positions = 20, row = 2;
  KvCache cache(1, B, capacity, 1, row, host_memory(), nullptr, 0, window, max_positions);
  EXPECT_EQ(cache.bytes(), 2 * B * capacity * row * 4);  // slots, not positions
  // Writes n positions whose keys are their position (values: minus it) in every element.
  const auto write = [&](int64_t n) {
    std::vector<float> k(static_cast<size_t>(B * n * row)), v(k.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < row; ++j) {
          const float position = static_cast<float>(cache.length() + t);
          k[static_cast<size_t>((b * n + t) * row + j)] = 100 * b + position;
          v[static_cast<size_t>((b * n + t) * row + j)] = -(100 * b + position);
        }
    cache.make_room(n);
    cache.write(0, k.data(), v.data(), row, n);
    cache.advance(n);
  };
  const auto expect_slots_hold_positions = [&] {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t slot = 0; slot < cache.stored(); ++slot) {
        const float position = static_cast<float>(cache.first_position() + slot);
        const int64_t at = b * cache.batch_stride() + slot * row + 1;
        ASSERT_EQ(cache.keys(0)[at], 100 * b + position) << "slot " << slot;
        ASSERT_EQ(cache.values(0)[at], -(100 * b + position)) << "slot " << slot;
      }
  };
  write(5);
  EXPECT_EQ(cache.max_write(), 3);  // 1 free slot and the 2 entries older than the window's 3
  write(3);  // 5 stored + 3 > 6: positions 2, 3, 4 to slots 0..2, moved 2 slots (blocks of 2, 1)
  EXPECT_EQ(cache.first_position(), 2);
  EXPECT_EQ(cache.stored(), 6);
  EXPECT_EQ(cache.length(), 8);
  expect_slots_hold_positions();
  for (int i = 0; i < 9; ++i) write(1);  // rolls three times more, by 3 slots each
  EXPECT_EQ(cache.length(), 17);
  EXPECT_EQ(cache.room(), 3);
  EXPECT_GE(cache.stored(), window - 1);
  expect_slots_hold_positions();
  std::vector<float> four(static_cast<size_t>(B * 4 * row));
  cache.make_room(4);  // keeps 3 slots; but only 3 positions are left before max_positions
  EXPECT_THROW(cache.write(0, four.data(), four.data(), row, 4), Error);
  // Only entries inside the window: make_room has nothing to drop, and a write too large is
  // refused.
  cache.clear();
  write(3);
  cache.make_room(5);
  EXPECT_EQ(cache.stored(), 3);
  std::vector<float> five(static_cast<size_t>(B * 5 * row));
  EXPECT_THROW(cache.write(0, five.data(), five.data(), row, 5), Error);
  EXPECT_THROW(KvCache(1, B, capacity, 1, row, host_memory(), nullptr, 0, capacity + 1, 20),
               Error);  // a window wider than the slots
  EXPECT_THROW(KvCache(1, B, capacity, 1, row, host_memory(), nullptr, 0, 0, 20),
               Error);  // more positions than slots without a window
}

class CachedForward : public ::testing::TestWithParam<Family> {
 protected:
  CachedForward() : config_(tiny(GetParam())), model_(config_, nullptr) { model_.initialize(5); }
  ModelConfig config_;
  Transformer model_;
  kernels::CpuOps ops_;
  LayerContext ctx_{ops_, kernels::Precision::fp32, nullptr};

  void feed_and_compare(KvCache& cache, const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                        int64_t window_start, int64_t t0, int64_t t1);
};

// Feeds tokens[:, t0:t1) to the cache and expects the logits of the full forward over
// tokens[:, window_start:t1).
void CachedForward::feed_and_compare(KvCache& cache, const std::vector<int32_t>& tokens, int64_t B,
                                     int64_t T, int64_t window_start, int64_t t0, int64_t t1) {
  const int64_t V = config_.vocab_size;
  const std::vector<int32_t> chunk = columns(tokens, B, T, t0, t1);
  const float* logits = model_.forward_cached(ctx_, cache, chunk.data(), B, t1 - t0);
  // A copy: the full forward below reuses the model's logits buffer.
  const std::vector<float> cached(logits, logits + B * V);
  const std::string what = "tokens [" + std::to_string(t0) + ", " + std::to_string(t1) + ")";
  expect_close(cached.data(), full_forward_last(model_, ctx_, tokens, B, T, window_start, t1),
               what.c_str());
}

TEST_P(CachedForward, PrefillThenSingleTokensEqualTheFullForward) {
  const int64_t T = 20;
  for (int64_t B : {1, 3}) {
    const std::vector<int32_t> tokens = random_tokens(B * T, config_.vocab_size, 100 + B);
    for (int64_t prompt : {1, 6}) {
      SCOPED_TRACE("batch " + std::to_string(B) + ", prompt of " + std::to_string(prompt));
      KvCache cache = model_.make_kv_cache(B, host_memory());
      EXPECT_EQ(cache.max_positions(), config_.max_seq_len);
      // mistral-tiny's window of 8 rolls over 16 slots (T = 20 rolls it); the others hold all 32.
      EXPECT_EQ(cache.capacity(),
                config_.sliding_window > 0 ? 2 * config_.sliding_window : config_.max_seq_len);
      EXPECT_EQ(cache.kv_heads(), config_.n_kv_heads);
      feed_and_compare(cache, tokens, B, T, 0, 0, prompt);
      for (int64_t t = prompt; t < T; ++t) feed_and_compare(cache, tokens, B, T, 0, t, t + 1);
      EXPECT_EQ(cache.length(), T);
    }
  }
}

TEST_P(CachedForward, ChunksAfterThePrefillEqualTheFullForward) {
  const int64_t B = 2, T = 13;
  const std::vector<int32_t> tokens = random_tokens(B * T, config_.vocab_size, 7);
  KvCache cache = model_.make_kv_cache(B, host_memory());
  feed_and_compare(cache, tokens, B, T, 0, 0, 5);
  feed_and_compare(cache, tokens, B, T, 0, 5, 9);
  feed_and_compare(cache, tokens, B, T, 0, 9, 12);
  feed_and_compare(cache, tokens, B, T, 0, 12, 13);
}

// A prompt longer than a windowed cache's slots is taken in pieces; chunks after it roll the cache.
TEST_P(CachedForward, APromptLongerThanTheSlotsAndLaterChunksEqualTheFullForward) {
  const int64_t B = 2, T = config_.max_seq_len;
  const std::vector<int32_t> tokens = random_tokens(B * T, config_.vocab_size, 13);
  KvCache cache = model_.make_kv_cache(B, host_memory());
  feed_and_compare(cache, tokens, B, T, 0, 0, 21);
  feed_and_compare(cache, tokens, B, T, 0, 21, 30);
  feed_and_compare(cache, tokens, B, T, 0, 30, T);
  EXPECT_EQ(cache.length(), T);
  if (config_.sliding_window > 0) EXPECT_GT(cache.first_position(), 0);
}

// The generator's sliding window: a full cache refuses one more position; cleared and re-prefilled
// with the last half window (ending with the new token), it continues as the full forward over
// that window (positions restart at 0; stale entries beyond the new length are never read).
TEST_P(CachedForward, AFullCacheRefusesMoreAndARePrefilledWindowContinuesCorrectly) {
  const int64_t B = 2, capacity = config_.max_seq_len, T = capacity + 8;
  const std::vector<int32_t> tokens = random_tokens(B * T, config_.vocab_size, 11);
  KvCache cache = model_.make_kv_cache(B, host_memory());
  feed_and_compare(cache, tokens, B, T, 0, 0, capacity);
  const std::vector<int32_t> next = columns(tokens, B, T, capacity, capacity + 1);
  EXPECT_THROW(model_.forward_cached(ctx_, cache, next.data(), B, 1), Error);
  EXPECT_EQ(cache.length(), capacity);  // the refused call changed nothing

  cache.clear();
  const int64_t window_start = capacity + 1 - capacity / 2;
  feed_and_compare(cache, tokens, B, T, window_start, window_start, capacity + 1);
  EXPECT_EQ(cache.length(), capacity / 2);
  for (int64_t t = capacity + 1; t < T; ++t)
    feed_and_compare(cache, tokens, B, T, window_start, t, t + 1);
}

TEST_P(CachedForward, RefusesACacheOfAnotherShape) {
  std::vector<int32_t> tokens(2, 1);
  KvCache wrong_batch = model_.make_kv_cache(2, host_memory());
  EXPECT_THROW(model_.forward_cached(ctx_, wrong_batch, tokens.data(), 1, 1), Error);
  KvCache wrong_heads(config_.n_layers, 1, config_.max_seq_len, config_.n_kv_heads + 1,
                      config_.head_dim(), host_memory());
  EXPECT_THROW(model_.forward_cached(ctx_, wrong_heads, tokens.data(), 1, 1), Error);
  KvCache good = model_.make_kv_cache(1, host_memory());
  tokens[0] = static_cast<int32_t>(config_.vocab_size);
  EXPECT_THROW(model_.forward_cached(ctx_, good, tokens.data(), 1, 1), Error);
  EXPECT_EQ(good.length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, CachedForward,
                         ::testing::Values(Family::gpt2, Family::llama, Family::mistral,
                                           Family::qwen3, Family::deepseek),
                         [](const auto& info) { return family_name(info.param); });
