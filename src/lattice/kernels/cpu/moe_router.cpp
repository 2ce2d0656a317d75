// Mixture-of-experts routing: see moe_router.hpp.
#include "lattice/kernels/cpu/moe_router.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

namespace {

constexpr int64_t kChunk = 256;  // tokens per chunk of the statistics' fixed summation order

void check_shape(const RouterShape& s) {
  check(s.tokens >= 0 && s.experts >= 1 && s.top_k >= 1 && s.top_k <= s.experts,
        "moe router: top_k (" + std::to_string(s.top_k) +
            ") must be in [1, experts = " + std::to_string(s.experts) + "] and tokens (" +
            std::to_string(s.tokens) + ") non-negative");
  check(s.groups >= 1 && s.experts % s.groups == 0 &&
            (s.groups == 1 || s.experts / s.groups >= 2) && s.top_groups >= 1 &&
            s.top_groups <= s.groups && s.top_k <= s.top_groups * (s.experts / s.groups),
        "moe router: " + std::to_string(s.groups) + " groups of " + std::to_string(s.experts) +
            " experts (at least 2 each), the best " + std::to_string(s.top_groups) +
            " of them holding at least top_k = " + std::to_string(s.top_k));
}

// Group-limited routing: marks `taken` (1: not eligible) every expert outside the token's
// `top_groups` best groups, a group scored by the sum of its two largest keys (score + bias).
void exclude_groups(std::vector<char>& taken, const float* s, const float* bias,
                    const RouterShape& shape) {
  const int64_t G = shape.groups, per_group = shape.experts / G;
  std::vector<float> group_score(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    float first = 0, second = 0;
    for (int64_t j = 0; j < per_group; ++j) {
      const int64_t e = g * per_group + j;
      const float key = s[e] + (bias ? bias[e] : 0.0f);
      if (j == 0 || key > first) {
        if (j > 0) second = first;
        first = key;
      } else if (j == 1 || key > second) {
        second = key;
      }
    }
    group_score[g] = first + second;
  }
  std::vector<char> kept(static_cast<size_t>(G), 0);
  for (int64_t n = 0; n < shape.top_groups; ++n) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
    kept[best] = 1;
  }
  for (int64_t e = 0; e < shape.experts; ++e) taken[e] = kept[e / per_group] ? 0 : 1;
}

// log Σ_e exp(x_e), in double.
double log_sum_exp(const float* x, int64_t n) {
  const double m = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += std::exp(static_cast<double>(x[e]) - m);
  return m + std::log(sum);
}

}  // namespace

void moe_router_forward(int32_t* experts, float* weights, float* scores, const float* logits,
                        const float* bias, const RouterShape& shape,
                        const RouterStatistics& stats) {
  check_shape(shape);
  const int64_t T = shape.tokens, E = shape.experts, K = shape.top_k;
  const int64_t chunks = (T + kChunk - 1) / kChunk;
  // Per chunk: its counts, score sums and z sum, added in chunk order afterwards.
  std::vector<int64_t> chunk_counts(stats.counts ? chunks * E : 0);
  std::vector<double> chunk_sums(stats.score_sums ? chunks * E : 0);
  std::vector<double> chunk_z(stats.z_sum ? chunks : 0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = c * kChunk; t < std::min(T, (c + 1) * kChunk); ++t) {
      const float* x = logits + t * E;
      float* s = scores + t * E;
      const double lse = shape.score == RouterScore::softmax || stats.z_sum ? log_sum_exp(x, E) : 0;
      for (int64_t e = 0; e < E; ++e)
        s[e] = shape.score == RouterScore::softmax
                   ? static_cast<float>(std::exp(static_cast<double>(x[e]) - lse))
                   : static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[e]))));
      // Top-k by score + bias, ties to the lower index.
      if (shape.groups > 1)
        exclude_groups(taken, s, bias, shape);
      else
        std::fill(taken.begin(), taken.end(), 0);
      double chosen_sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        float best_key = 0;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[e]) continue;
          const float key = s[e] + (bias ? bias[e] : 0.0f);
          if (best < 0 || key > best_key) {
            best = e;
            best_key = key;
          }
        }
        taken[best] = 1;
        experts[t * K + k] = static_cast<int32_t>(best);
        chosen_sum += s[best];
      }
      for (int64_t k = 0; k < K; ++k) {
        const double score = s[experts[t * K + k]];
        weights[t * K + k] =
            static_cast<float>((shape.normalize ? score / chosen_sum : score) * shape.scaling);
      }
      if (stats.counts)
        for (int64_t k = 0; k < K; ++k) ++chunk_counts[c * E + experts[t * K + k]];
      if (stats.score_sums)
        for (int64_t e = 0; e < E; ++e) chunk_sums[c * E + e] += s[e];
      if (stats.z_sum) chunk_z[c] += lse * lse;
    }
  }
  if (stats.counts) std::fill(stats.counts, stats.counts + E, 0);
  if (stats.score_sums) std::fill(stats.score_sums, stats.score_sums + E, 0.0);
  if (stats.z_sum) *stats.z_sum = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t e = 0; stats.counts && e < E; ++e) stats.counts[e] += chunk_counts[c * E + e];
    for (int64_t e = 0; stats.score_sums && e < E; ++e)
      stats.score_sums[e] += chunk_sums[c * E + e];
    if (stats.z_sum) *stats.z_sum += chunk_z[c];
  }
}

void moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                         const float* scores, const float* logits, const RouterShape& shape,
                         const RouterLossGradients& losses) {
  check_shape(shape);
  const int64_t T = shape.tokens, E = shape.experts, K = shape.top_k;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    const int32_t* chosen = experts + t * K;
    const float* g = d_weights + t * K;
    float* d = d_logits + t * E;
    // The gradient of the scores: through the weights, then the balancing loss's.
    std::vector<double> d_score(static_cast<size_t>(E), 0.0);
    double chosen_sum = 0, weighted = 0;
    for (int64_t k = 0; k < K; ++k) chosen_sum += s[chosen[k]];
    for (int64_t k = 0; k < K; ++k)
      weighted += static_cast<double>(g[k]) * s[chosen[k]] / chosen_sum;
    for (int64_t k = 0; k < K; ++k) {
      const double gk = static_cast<double>(g[k]) * shape.scaling;
      d_score[chosen[k]] = shape.normalize ? (gk - weighted * shape.scaling) / chosen_sum : gk;
    }
    if (losses.score_grad)
      for (int64_t e = 0; e < E; ++e) d_score[e] += losses.score_grad[e];
    if (shape.score == RouterScore::softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += d_score[e] * s[e];
      for (int64_t e = 0; e < E; ++e) d[e] = static_cast<float>(s[e] * (d_score[e] - dot));
    } else {
      for (int64_t e = 0; e < E; ++e)
        d[e] = static_cast<float>(d_score[e] * s[e] * (1.0 - static_cast<double>(s[e])));
    }
    if (losses.z_grad != 0.0f) {
      const float* x = logits + t * E;
      const double lse = log_sum_exp(x, E);
      for (int64_t e = 0; e < E; ++e)
        d[e] += static_cast<float>(2.0 * losses.z_grad * lse *
                                   std::exp(static_cast<double>(x[e]) - lse));
    }
  }
}

}  // namespace lattice::kernels
