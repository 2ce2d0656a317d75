// Tests for the CPU mixture-of-experts router: the forward's scores, choices and weights against a
// double-precision reference written here (softmax and sigmoid scores, renormalised or not, a
// scaling factor, a bias that steers the choice only, ties to the lower index); the statistics
// (counts, score sums, z sum); the backward against central differences of that reference's loss
// (through the weights, the load-balancing term and the z-loss); bit-identical results for 1, 2
// and 3 OpenMP threads; group-limited routing (DeepSeek-V3's n_group / topk_group); and the
// refusal of top_k above the experts or of groups that cannot hold the choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/moe_router.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::random_vector;

// The reference router for one token in double: scores, the chosen experts (by score + bias, ties
// to the lower index) and their weights.
struct TokenRoute {
  std::vector<double> scores, weights;
  std::vector<int> experts;
  double lse = 0;
};

TokenRoute route_token(const double* x, const float* bias, const RouterShape& s) {
  TokenRoute r;
  const int E = static_cast<int>(s.experts);
  double m = x[0];
  for (int e = 1; e < E; ++e) m = std::max(m, x[e]);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(x[e] - m);
  r.lse = m + std::log(sum);
  for (int e = 0; e < E; ++e)
    r.scores.push_back(s.score == RouterScore::softmax ? std::exp(x[e] - r.lse)
                                                       : 1.0 / (1.0 + std::exp(-x[e])));
  const auto key = [&](int e) { return r.scores[e] + (bias ? bias[e] : 0); };
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
  if (s.groups > 1) {  // keep the experts of the best groups (by their two best keys), in order
    const int G = static_cast<int>(s.groups), per = E / G;
    std::vector<double> group_score(G);
    for (int g = 0; g < G; ++g) {
      std::vector<double> keys;
      for (int j = 0; j < per; ++j) keys.push_back(key(g * per + j));
      std::sort(keys.rbegin(), keys.rend());
      group_score[g] = keys[0] + keys[1];
    }
    std::vector<int> groups(G);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int a, int b) { return group_score[a] > group_score[b]; });
    std::vector<bool> kept(G, false);
    for (int n = 0; n < s.top_groups; ++n) kept[groups[n]] = true;
    std::erase_if(order, [&](int e) { return !kept[e / per]; });
  }
  r.experts.assign(order.begin(), order.begin() + s.top_k);
  double chosen = 0;
  for (int e : r.experts) chosen += r.scores[e];
  for (int e : r.experts)
    r.weights.push_back((s.normalize ? r.scores[e] / chosen : r.scores[e]) * s.scaling);
  return r;
}

// Σ_t [ Σ_k g_tk w_tk + Σ_e c_e s_te + z lse_t² ]: the loss whose logit gradient the backward
// writes (for fixed choices).
double reference_loss(const std::vector<double>& logits, const float* bias, const RouterShape& s,
                      const std::vector<float>& g, const std::vector<float>& c, float z) {
  double loss = 0;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const TokenRoute r = route_token(logits.data() + t * s.experts, bias, s);
    for (int64_t k = 0; k < s.top_k; ++k) loss += g[t * s.top_k + k] * r.weights[k];
    for (int64_t e = 0; e < s.experts; ++e) loss += (c.empty() ? 0.0 : c[e]) * r.scores[e];
    loss += z * r.lse * r.lse;
  }
  return loss;
}

struct Case {
  RouterScore score;
  bool normalize;
  float scaling;
  int64_t tokens, experts, top_k;
  bool bias;
  int64_t groups = 1, top_groups = 1;
};

const Case kCases[] = {
    {RouterScore::softmax, true, 1.0f, 37, 8, 2, false},     // Mixtral
    {RouterScore::softmax, false, 1.0f, 300, 16, 4, false},  // Switch-style, two chunks
    {RouterScore::sigmoid, true, 2.5f, 19, 64, 6, true},     // DeepSeek-V3 with its bias
    {RouterScore::softmax, true, 1.0f, 5, 4, 4, false},      // every expert chosen
    {RouterScore::softmax, true, 1.0f, 3, 1, 1, false},      // one expert
    // DeepSeek-V3's group-limited routing: 8 groups, the best 4 (as its 256 experts), and a
    // choice that fills the chosen groups (4 groups of 2, the best 2, top 4).
    {RouterScore::sigmoid, true, 2.5f, 41, 64, 6, true, 8, 4},
    {RouterScore::sigmoid, true, 2.5f, 23, 8, 4, false, 4, 2},
};

RouterShape shape_of(const Case& c) {
  RouterShape s;
  s.tokens = c.tokens;
  s.experts = c.experts;
  s.top_k = c.top_k;
  s.score = c.score;
  s.normalize = c.normalize;
  s.scaling = c.scaling;
  s.groups = c.groups;
  s.top_groups = c.top_groups;
  return s;
}

TEST(MoeRouter, ForwardMatchesTheDoublePrecisionReference) {
  for (const Case& c : kCases) {
    const RouterShape s = shape_of(c);
    SCOPED_TRACE(std::to_string(c.tokens) + " tokens, " + std::to_string(c.experts) +
                 " experts, top " + std::to_string(c.top_k));
    const std::vector<float> logits = random_vector(s.tokens * s.experts, 3, 2.0f);
    const std::vector<float> bias = random_vector(s.experts, 4, 0.3f);
    const float* b = c.bias ? bias.data() : nullptr;
    std::vector<int32_t> experts(s.tokens * s.top_k);
    std::vector<float> weights(experts.size()), scores(logits.size());
    std::vector<int64_t> counts(s.experts);
    std::vector<double> sums(s.experts);
    double z_sum = 0;
    moe_router_forward(experts.data(), weights.data(), scores.data(), logits.data(), b, s,
                       {counts.data(), sums.data(), &z_sum});
    std::vector<double> want_sums(s.experts, 0.0);
    std::vector<int64_t> want_counts(s.experts, 0);
    double want_z = 0;
    for (int64_t t = 0; t < s.tokens; ++t) {
      std::vector<double> x(logits.begin() + t * s.experts, logits.begin() + (t + 1) * s.experts);
      const TokenRoute r = route_token(x.data(), b, s);
      for (int64_t e = 0; e < s.experts; ++e) {
        EXPECT_NEAR(scores[t * s.experts + e], r.scores[e], 1e-6 * std::max(1.0, r.scores[e]));
        want_sums[e] += r.scores[e];
      }
      for (int64_t k = 0; k < s.top_k; ++k) {
        EXPECT_EQ(experts[t * s.top_k + k], r.experts[k]) << "token " << t << " choice " << k;
        EXPECT_NEAR(weights[t * s.top_k + k], r.weights[k], 2e-6 * std::max(1.0, r.weights[k]));
        ++want_counts[r.experts[k]];
      }
      want_z += r.lse * r.lse;
    }
    EXPECT_EQ(counts, want_counts);
    for (int64_t e = 0; e < s.experts; ++e) EXPECT_NEAR(sums[e], want_sums[e], 1e-5);
    EXPECT_NEAR(z_sum, want_z, 1e-9 * std::max(1.0, want_z));
  }
}

TEST(MoeRouter, BiasSteersTheChoiceButNotTheWeights) {
  // Two experts, one token: scores 0.6 and 0.4 (softmax of log 0.6, log 0.4). A bias of +0.3 on
  // expert 1 makes it the choice; its weight is its own score, unbiased (not renormalised here).
  RouterShape s;
  s.tokens = 1;
  s.experts = 2;
  s.top_k = 1;
  s.normalize = false;
  const float logits[2] = {std::log(0.6f), std::log(0.4f)}, bias[2] = {0.0f, 0.3f};
  int32_t expert = -1;
  float weight = 0, scores[2];
  moe_router_forward(&expert, &weight, scores, logits, nullptr, s);
  EXPECT_EQ(expert, 0);
  EXPECT_NEAR(weight, 0.6f, 1e-6);
  moe_router_forward(&expert, &weight, scores, logits, bias, s);
  EXPECT_EQ(expert, 1);
  EXPECT_NEAR(weight, 0.4f, 1e-6);
  // Equal scores: the lower index wins.
  const float even[2] = {0.5f, 0.5f};
  moe_router_forward(&expert, &weight, scores, even, nullptr, s);
  EXPECT_EQ(expert, 0);
}

TEST(MoeRouter, BackwardMatchesCentralDifferences) {
  for (const Case& c : kCases) {
    const RouterShape s = shape_of(c);
    SCOPED_TRACE(std::to_string(c.tokens) + " tokens, " + std::to_string(c.experts) +
                 " experts, top " + std::to_string(c.top_k));
    const std::vector<float> logits = random_vector(s.tokens * s.experts, 5, 2.0f);
    const std::vector<float> bias = random_vector(s.experts, 6, 0.3f);
    const float* b = c.bias ? bias.data() : nullptr;
    const std::vector<float> g = random_vector(s.tokens * s.top_k, 7);
    const std::vector<float> score_grad = random_vector(s.experts, 8, 0.1f);
    const float z = 0.01f;
    std::vector<int32_t> experts(s.tokens * s.top_k);
    std::vector<float> weights(experts.size()), scores(logits.size()), d(logits.size());
    moe_router_forward(experts.data(), weights.data(), scores.data(), logits.data(), b, s);
    moe_router_backward(d.data(), g.data(), experts.data(), scores.data(), logits.data(), s,
                        {score_grad.data(), z});
    // Central differences of the double reference, where the step keeps every choice (the loss
    // is smooth there): h = 1e-5 on logits of order 2, truncation error ~h² · 10.
    std::vector<double> x(logits.begin(), logits.end());
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i], h = 1e-5;
      x[i] = keep + h;
      const double up = reference_loss(x, b, s, g, score_grad, z);
      x[i] = keep - h;
      const double down = reference_loss(x, b, s, g, score_grad, z);
      x[i] = keep;
      const double numeric = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(numeric - d[i]) / std::max(1.0, std::abs(numeric)));
    }
    // The kernel keeps scores in fp32: relative 1e-5 of gradients of order 1.
    EXPECT_LT(worst, 1e-5);
  }
}

TEST(MoeRouter, ResultsDoNotDependOnTheThreadCount) {
  RouterShape s;
  s.tokens = 700;  // three chunks of the statistics' order
  s.experts = 32;
  s.top_k = 4;
  const std::vector<float> logits = random_vector(s.tokens * s.experts, 9, 2.0f);
  const std::vector<float> g = random_vector(s.tokens * s.top_k, 10);
  struct Run {
    std::vector<int32_t> experts;
    std::vector<float> weights, scores, d;
    std::vector<double> sums;
  };
  std::vector<Run> runs;
  for (int threads : {1, 2, 3}) {
    testing::ScopedOmpThreads scope(threads);
    Run r{std::vector<int32_t>(s.tokens * s.top_k), std::vector<float>(s.tokens * s.top_k),
          std::vector<float>(logits.size()), std::vector<float>(logits.size()),
          std::vector<double>(s.experts)};
    moe_router_forward(r.experts.data(), r.weights.data(), r.scores.data(), logits.data(), nullptr,
                       s, {nullptr, r.sums.data(), nullptr});
    moe_router_backward(r.d.data(), g.data(), r.experts.data(), r.scores.data(), logits.data(), s,
                        {nullptr, 0.001f});
    runs.push_back(std::move(r));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].experts, runs[0].experts);
    EXPECT_EQ(runs[i].weights, runs[0].weights);
    EXPECT_EQ(runs[i].d, runs[0].d);
    EXPECT_EQ(runs[i].sums, runs[0].sums);
  }
}

TEST(MoeRouter, GroupLimitedRoutingChoosesWithinTheBestGroupsOnly) {
  // Four experts in two groups, top 2 from the best group: group 0's two scores sum to 1.0
  // (.9 + .1), group 1's to 1.1 (.6 + .5), so the token takes experts 2 and 3 although expert 0
  // scores highest; without groups it takes 0 and 2. A bias of +.3 on expert 1 lifts group 0's
  // keys to 1.3 and the choice back to it (weighted by the scores, not the keys).
  RouterShape s;
  s.tokens = 1;
  s.experts = 4;
  s.top_k = 2;
  s.score = RouterScore::sigmoid;
  s.normalize = false;
  float logits[4];
  const float want[4] = {0.9f, 0.1f, 0.6f, 0.5f};
  for (int e = 0; e < 4; ++e) logits[e] = std::log(want[e] / (1 - want[e]));  // sigmoid's inverse
  int32_t experts[2];
  float weights[2], scores[4];
  moe_router_forward(experts, weights, scores, logits, nullptr, s);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 2);
  s.groups = 2;
  moe_router_forward(experts, weights, scores, logits, nullptr, s);
  EXPECT_EQ(experts[0], 2);
  EXPECT_EQ(experts[1], 3);
  EXPECT_NEAR(weights[0], 0.6f, 1e-6);  // the scores, not the keys
  const float bias[4] = {0.0f, 0.3f, 0.0f, 0.0f};
  moe_router_forward(experts, weights, scores, logits, bias, s);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 1);
  EXPECT_NEAR(weights[1], 0.1f, 1e-6);
}

TEST(MoeRouter, RefusesGroupsThatCannotHoldTheChoice) {
  RouterShape s;
  s.tokens = 1;
  s.experts = 8;
  s.top_k = 4;
  int32_t experts[4];
  float weights[4], scores[8], logits[8] = {};
  for (auto [groups, top] : {std::pair{3, 1}, {8, 2}, {4, 1}, {4, 5}}) {
    s.groups = groups;  // 3 does not divide 8; groups of 1; 2 experts < top_k; 5 > 4 groups
    s.top_groups = top;
    EXPECT_THROW(moe_router_forward(experts, weights, scores, logits, nullptr, s), Error);
  }
  s.groups = 4;
  s.top_groups = 2;
  EXPECT_NO_THROW(moe_router_forward(experts, weights, scores, logits, nullptr, s));
}

TEST(MoeRouter, RefusesTopKAboveTheExperts) {
  RouterShape s;
  s.tokens = 1;
  s.experts = 2;
  s.top_k = 3;
  int32_t experts[3];
  float weights[3], scores[2], logits[2] = {0, 0};
  EXPECT_THROW(moe_router_forward(experts, weights, scores, logits, nullptr, s), Error);
}

}  // namespace
}  // namespace lattice::kernels
