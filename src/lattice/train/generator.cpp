// Generator: see generator.hpp.
#include "lattice/train/generator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

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

void generate(model::Transformer& model, kernels::MatmulEngine& matmul,
              std::vector<int32_t>& tokens, const SamplingSettings& settings,
              const std::function<void(int32_t)>& on_token) {
  check(!tokens.empty(), "generation needs a prompt of at least one token");
  const auto& config = model.config();
  Rng rng(settings.seed);
  model::LayerContext ctx{matmul, kernels::Precision::fp32, nullptr};
  for (int64_t i = 0; i < settings.max_new_tokens; ++i) {
    const int64_t window =
        std::min<int64_t>(static_cast<int64_t>(tokens.size()), config.max_seq_len);
    const int32_t* start = tokens.data() + tokens.size() - window;
    const float* logits = model.logits(ctx, start, 1, window);
    int32_t next =
        sample_token(logits + (window - 1) * config.vocab_size, config.vocab_size, settings, rng);
    tokens.push_back(next);
    on_token(next);
    if (next == settings.stop_token) break;
  }
}

}  // namespace lattice::train
