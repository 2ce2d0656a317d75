// Generator: see generator.hpp.
#include "lattice/train/generator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::train {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingSettings& settings,
                     Rng& rng) {
  if (settings.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  size_t keep = order.size();
  if (settings.top_k > 0) keep = std::min(keep, static_cast<size_t>(settings.top_k));
  std::vector<double> probs(keep);
  const double top = logits[order[0]] / settings.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += probs[i] = std::exp(logits[order[i]] / settings.temperature - top);
  if (settings.top_p < 1.0f) {
    double cumulative = 0;
    size_t nucleus = 0;
    while (nucleus < keep && cumulative < settings.top_p * sum) cumulative += probs[nucleus++];
    keep = std::max<size_t>(1, nucleus);
    sum = cumulative;
  }
  double r = rng.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r < 0) return order[i];
  }
  return order[keep - 1];
}

double GenerationStats::tokens_per_second() const {
  return generation_seconds > 0 ? static_cast<double>(generated_tokens) / generation_seconds : 0.0;
}

std::string GenerationStats::summary() const {
  char line[192];
  std::snprintf(line, sizeof line,
                "generated %lld tokens in %.3f s (%.1f tokens/s) after a prefill of %lld tokens in "
                "%.3f s",
                static_cast<long long>(generated_tokens), generation_seconds, tokens_per_second(),
                static_cast<long long>(prompt_tokens), prefill_seconds);
  std::string text = line;
  if (window_slides > 0)
    text += "; the full context window slid " + std::to_string(window_slides) + " times";
  return text;
}

GenerationStats generate(model::Transformer& model, kernels::Ops& ops, std::vector<int32_t>& tokens,
                         const SamplingSettings& settings,
                         const std::function<void(int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  check(!tokens.empty(), "generation needs a prompt of at least one token");
  const int64_t vocab = settings.vocab_limit > 0
                            ? std::min(settings.vocab_limit, model.config().vocab_size)
                            : model.config().vocab_size;
  GenerationStats stats;
  if (settings.max_new_tokens <= 0) return stats;
  Rng rng(settings.seed);
  model::LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  model::KvCache cache = model.make_kv_cache(1, ops.memory());
  const int64_t capacity = cache.max_positions();  // positions: a windowed cache rolls its slots
  // Runs the last `count` tokens at the cache's next positions; returns the last one's logits,
  // copied to the host for sampling.
  std::vector<float> host_logits(static_cast<size_t>(vocab));
  const auto run_last = [&](int64_t count) {
    const float* device_logits =
        model.forward_cached(ctx, cache, tokens.data() + tokens.size() - count, 1, count);
    ops.memory().copy(host_logits.data(), device_logits, host_logits.size() * sizeof(float),
                      CopyKind::device_to_host);
    return static_cast<const float*>(host_logits.data());
  };

  const auto prefill_start = Clock::now();
  stats.prompt_tokens = std::min<int64_t>(static_cast<int64_t>(tokens.size()), capacity);
  const float* logits = run_last(stats.prompt_tokens);
  stats.prefill_seconds = seconds_since(prefill_start);

  const auto generation_start = Clock::now();
  while (true) {
    const int32_t next = sample_token(logits, vocab, settings, rng);
    tokens.push_back(next);
    ++stats.generated_tokens;
    on_token(next);
    if (next == settings.stop_token || stats.generated_tokens == settings.max_new_tokens) break;
    if (cache.room() == 0) {  // slide: keep the last half window, positions restart at 0
      cache.clear();
      ++stats.window_slides;
      logits = run_last(std::max<int64_t>(1, capacity / 2));
    } else {
      logits = run_last(1);
    }
  }
  stats.generation_seconds = seconds_since(generation_start);
  return stats;
}

}  // namespace lattice::train
