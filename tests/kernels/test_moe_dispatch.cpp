// Tests for a mixture-of-experts layer's dispatch: the expert-sorted plan (dropless and with a
// capacity: which copies are kept, in token order, and their slots), the capacity formula, the
// refusal of bad expert ids and factors; the CPU row moves against direct loops (gather, combine),
// their backwards as the adjoints (the gather's backward) and derivatives (the combine's, which
// is bilinear) of the forwards; bit-identical results for 1, 2 and 3 OpenMP threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/moe_rows.hpp"
#include "lattice/kernels/moe_dispatch.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::random_vector;

// Distinct experts per token (as a router's top-k): token t's k-th choice.
std::vector<int32_t> random_choices(int64_t tokens, int64_t top_k, int64_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> picked;
    while (static_cast<int64_t>(picked.size()) < top_k) {
      const auto e = static_cast<int32_t>(rng.uniform() * static_cast<float>(experts)) %
                     static_cast<int32_t>(experts);
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
    }
    out.insert(out.end(), picked.begin(), picked.end());
  }
  return out;
}

TEST(MoeDispatch, DroplessSortsEveryCopyByExpertInTokenOrder) {
  // 3 tokens, top 2 of 3 experts: (0, 2), (2, 1), (0, 1).
  const std::vector<int32_t> choices = {0, 2, 2, 1, 0, 1};
  const MoeDispatch d = plan_moe_dispatch(choices.data(), 3, 2, 3);
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(d.slot_token, (std::vector<int32_t>{0, 2, 1, 2, 0, 1}));
  EXPECT_EQ(d.slot_of, (std::vector<int32_t>{0, 4, 5, 2, 1, 3}));
  EXPECT_EQ(d.dropped, 0);
  EXPECT_EQ(d.slots(), 6);
  EXPECT_EQ(d.count(1), 2);
}

TEST(MoeDispatch, CapacityKeepsEachExpertsFirstCopiesInTokenOrder) {
  const int64_t T = 200, K = 2, E = 8;
  const std::vector<int32_t> choices = random_choices(T, K, E, 1);
  const int64_t capacity = moe_capacity(1.0, T, K, E);  // 50
  EXPECT_EQ(capacity, 50);
  const MoeDispatch d = plan_moe_dispatch(choices.data(), T, K, E, capacity);
  std::vector<int64_t> seen(E, 0);
  int64_t dropped = 0;
  for (int64_t c = 0; c < T * K; ++c) {
    const int32_t e = choices[c];
    if (seen[e] < capacity) {
      ASSERT_GE(d.slot_of[c], 0) << c;
      EXPECT_EQ(d.slot_of[c], d.offsets[e] + seen[e]);
      EXPECT_EQ(d.slot_token[d.slot_of[c]], c / K);
      ++seen[e];
    } else {
      EXPECT_EQ(d.slot_of[c], -1) << c;
      ++dropped;
    }
  }
  EXPECT_EQ(d.dropped, dropped);
  EXPECT_GT(dropped, 0);  // random choices overflow some expert at factor 1
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(d.count(e), seen[e]);
  EXPECT_EQ(moe_capacity(1.25, 10, 2, 4), 7);  // ceil(6.25)
  EXPECT_THROW(moe_capacity(0.0, 10, 2, 4), Error);
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_THROW(plan_moe_dispatch(bad.data(), 1, 2, 3), Error);
}

TEST(MoeRows, GatherAndCombineMatchDirectLoopsAndTheirBackwardsAreTheirDerivatives) {
  const int64_t T = 97, K = 3, E = 6, C = 40;
  const std::vector<int32_t> choices = random_choices(T, K, E, 2);
  for (int64_t capacity : {int64_t{-1}, int64_t{40}}) {
    SCOPED_TRACE(capacity);
    const MoeDispatch d = plan_moe_dispatch(choices.data(), T, K, E, capacity);
    const int64_t S = d.slots();
    const std::vector<float> x = random_vector(T * C, 3), out_rows = random_vector(S * C, 4),
                             weights = random_vector(T * K, 5), dy = random_vector(T * C, 6),
                             d_perm = random_vector(S * C, 7);
    std::vector<float> gathered(S * C), y(T * C), d_x(T * C), d_out(S * C), d_w(T * K);
    moe_gather(gathered.data(), x.data(), d.slot_token.data(), S, C);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(gathered[s * C + c], x[d.slot_token[s] * C + c]);
    moe_combine(y.data(), out_rows.data(), weights.data(), d.slot_of.data(), T, K, C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k)
          if (d.slot_of[t * K + k] >= 0)
            want +=
                static_cast<double>(weights[t * K + k]) * out_rows[d.slot_of[t * K + k] * C + c];
        EXPECT_NEAR(y[t * C + c], want, 1e-5);
      }
    // The gather's backward is its adjoint: <gather(x), g> = <x, gather_backward(g)>.
    moe_gather_backward(d_x.data(), d_perm.data(), d.slot_of.data(), T, K, C);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < S * C; ++i) lhs += static_cast<double>(gathered[i]) * d_perm[i];
    for (int64_t i = 0; i < T * C; ++i) rhs += static_cast<double>(x[i]) * d_x[i];
    EXPECT_NEAR(lhs, rhs, 1e-6 * std::abs(lhs) + 1e-4);
    // L = <dy, combine(out, w)> is linear in each of out and w: its derivatives are exact.
    moe_combine_backward(d_out.data(), d_w.data(), dy.data(), out_rows.data(), weights.data(),
                         d.slot_of.data(), T, K, C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t slot = d.slot_of[t * K + k];
        double dot = 0;
        for (int64_t c = 0; c < C && slot >= 0; ++c)
          dot += static_cast<double>(dy[t * C + c]) * out_rows[slot * C + c];
        EXPECT_NEAR(d_w[t * K + k], dot, 1e-5) << t << " " << k;
        for (int64_t c = 0; c < C && slot >= 0; ++c)
          ASSERT_EQ(d_out[slot * C + c], weights[t * K + k] * dy[t * C + c]);
      }
  }
}

TEST(MoeRows, ResultsDoNotDependOnTheThreadCount) {
  const int64_t T = 1000, K = 2, E = 8, C = 64;
  const std::vector<int32_t> choices = random_choices(T, K, E, 8);
  const MoeDispatch d = plan_moe_dispatch(choices.data(), T, K, E);
  const int64_t S = d.slots();
  const std::vector<float> x = random_vector(T * C, 9), weights = random_vector(T * K, 10),
                           dy = random_vector(T * C, 11);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    testing::ScopedOmpThreads scope(threads);
    std::vector<float> g(S * C), y(T * C), dx(T * C), dout(S * C), dw(T * K);
    moe_gather(g.data(), x.data(), d.slot_token.data(), S, C);
    moe_combine(y.data(), g.data(), weights.data(), d.slot_of.data(), T, K, C);
    moe_combine_backward(dout.data(), dw.data(), dy.data(), g.data(), weights.data(),
                         d.slot_of.data(), T, K, C);
    moe_gather_backward(dx.data(), dout.data(), d.slot_of.data(), T, K, C);
    std::vector<float> all = y;
    all.insert(all.end(), dx.begin(), dx.end());
    all.insert(all.end(), dw.begin(), dw.end());
    results.push_back(all);
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

}  // namespace
}  // namespace lattice::kernels
