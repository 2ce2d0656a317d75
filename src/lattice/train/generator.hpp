// Generator: autoregressive sampling from a trained model (temperature, top-k, top-p, seed), over a
// sliding window of at most max_seq_len tokens. (Without a KV cache: each new token re-runs the
// window; the data-pipeline issue adds the cache.)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/model/transformer.hpp"

namespace lattice::train {

struct SamplingSettings {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 1;
  int32_t stop_token = -1;  // stop after emitting it (-1 = none)
};

// Picks the next token from one row of logits.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingSettings& settings,
                     Rng& rng);

// Appends up to max_new_tokens to `tokens`; calls on_token for each as it is produced.
void generate(model::Transformer& model, kernels::MatmulEngine& matmul,
              std::vector<int32_t>& tokens, const SamplingSettings& settings,
              const std::function<void(int32_t)>& on_token);

}  // namespace lattice::train
