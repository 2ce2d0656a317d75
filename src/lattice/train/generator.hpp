// Generator: autoregressive sampling from a trained model (temperature, top-k, top-p, seed, a stop
// token) with a KV cache: the prompt is prefilled in one forward, then each new token runs alone
// against the cached keys and values. When the cache is full (max_seq_len positions) it slides:
// the cache is cleared and re-prefilled with the last half window (max_seq_len / 2 tokens, ending
// with the newest), whose positions restart at 0, so each later token sees between max_seq_len / 2
// and max_seq_len tokens of context.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/model/transformer.hpp"

namespace lattice::train {

struct SamplingSettings {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 1;
  int32_t stop_token = -1;  // stop after emitting it (-1 = none)
  // Sample only ids below this (0 = the model's whole vocabulary): for a tokenizer with fewer ids
  // than a model whose vocabulary is padded.
  int64_t vocab_limit = 0;
};

// Picks the next token from one row of logits.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingSettings& settings,
                     Rng& rng);

// What one generate() call did.
struct GenerationStats {
  int64_t prompt_tokens = 0;     // tokens prefilled from the prompt (at most max_seq_len)
  int64_t generated_tokens = 0;  // the stop token included when it ended the generation
  int64_t window_slides = 0;     // re-prefills of a full cache with the last half window
  double prefill_seconds = 0;
  double generation_seconds = 0;  // from the end of the prefill to the last token
  // Generated tokens per second of generation_seconds (0 when nothing was generated).
  double tokens_per_second() const;
  // One line for stderr, e.g. "generated 200 tokens in 0.41 s (488.3 tokens/s) after a prefill
  // of 12 tokens in 0.004 s".
  std::string summary() const;
};

// Appends up to max_new_tokens to `tokens` (the prompt, at least one token); calls on_token for
// each as it is produced. Stops after emitting settings.stop_token.
GenerationStats generate(model::Transformer& model, kernels::Ops& ops, std::vector<int32_t>& tokens,
                         const SamplingSettings& settings,
                         const std::function<void(int32_t)>& on_token);

}  // namespace lattice::train
