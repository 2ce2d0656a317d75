// Expert parallelism of the MoE MLP (model/expert_parallel_comm.hpp): P ranks, each with its own
// tokens and E/P of the experts, exchange the token copies by all-to-all and back. Against one rank
// running the same layer on all ranks' tokens (concatenated in rank order), dropless: every
// expert sees the same copies in the same order in both (expert-major, then by source rank, which
// is token order of the concatenation), so the outputs, the input gradients and the experts' weight
// gradients are bit-equal; only the router's weight gradient, which each rank sums over its own
// tokens, is summed in another order (relative 1e-6: fp32 rounding of a reordered sum of P·T
// terms). With a capacity each rank drops within its own tokens (per-rank capacity): EP P drops
// the copies P separate one-rank layers drop, and computes the rest within 1e-6 of them (an
// expert's GEMM then has other rows beside each one, and the GEMM's blocking, chosen by the row
// count, moves a row's rounding: measured 3e-7). Unequal loads (a rank receiving no copies for an
// expert) are covered by the skewed router of the last case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../kernels/gradcheck.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/moe_mlp.hpp"

namespace lattice::model {
namespace {

using testing::random_vector;

constexpr int64_t kC = 8, kF = 12, kRows = 24;  // tokens per rank
const char* const kPrefix = "model.layers.0.block_sparse_moe.";

MoeSettings settings(int64_t experts, double capacity) {
  MoeSettings s;
  s.experts = experts;
  s.top_k = 2;
  s.capacity_factor = capacity;
  return s;
}

// One layer (its own store, initialised by name: the same values for an expert wherever it lives).
struct Layer {
  ParameterStore store;
  std::unique_ptr<MoeMlp> mlp;
  Layer(const MoeSettings& s, const ExpertParallelGroup& ep, float router_skew = 0) {
    mlp = std::make_unique<MoeMlp>(store, kPrefix, kC, kF, s, MoeNames::mixtral, ep);
    store.allocate(nullptr);
    store.initialize(11, 0.3f, 1);
    if (router_skew != 0) {  // expert 0's logits up: most copies go to rank 0's experts
      float* router = store.mutable_value(store.index_of(std::string(kPrefix) + "gate.weight"));
      for (int64_t c = 0; c < kC; ++c) router[c] += router_skew;
    }
  }
  const float* grad(const std::string& name) {
    return store.grad(store.index_of(std::string(kPrefix) + name));
  }
};

struct Result {
  std::vector<float> y, d_x;
  std::vector<bool> dropped;  // per copy (token, k)
};

Result run(Layer& layer, const float* x, const float* g, int64_t rows) {
  kernels::CpuOps ops;
  const LayerContext ctx{ops};
  MoeMlpActivations a;
  Result r;
  r.y.resize(static_cast<size_t>(rows * kC));
  r.d_x.resize(r.y.size());
  std::vector<float> x_copy(x, x + rows * kC);
  layer.mlp->forward(ctx, a, r.y.data(), x_copy.data(), rows);
  layer.store.zero_grads();
  layer.mlp->backward(ctx, a, r.d_x.data(), g, x_copy.data(), rows);
  for (int32_t slot : a.dispatch.slot_of) r.dropped.push_back(slot < 0);
  return r;
}

double relative_to_max(const float* a, const float* b, int64_t n) {
  double worst = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

// EP P against one rank on the concatenated tokens (dropless) or against P one-rank layers each on
// its own tokens (with a capacity).
void check_expert_parallel(int P, int64_t experts, double capacity, float router_skew = 0) {
  SCOPED_TRACE("ep " + std::to_string(P) + ", " + std::to_string(experts) + " experts, capacity " +
               std::to_string(capacity));
  const auto x = random_vector(P * kRows * kC, 3, 1.0f);
  const auto g = random_vector(P * kRows * kC, 4, 1.0f);
  const MoeSettings s = settings(experts, capacity);
  // The references: one rank over everything, and one rank per rank's own tokens.
  Layer whole(s, {}, router_skew);
  const Result all = run(whole, x.data(), g.data(), P * kRows);
  std::vector<Result> own(static_cast<size_t>(P));
  std::vector<std::unique_ptr<Layer>> own_layers;
  for (int r = 0; r < P; ++r) {
    own_layers.push_back(std::make_unique<Layer>(s, ExpertParallelGroup{}, router_skew));
    own[r] = run(*own_layers.back(), x.data() + r * kRows * kC, g.data() + r * kRows * kC, kRows);
  }
  std::vector<Result> ep(static_cast<size_t>(P));
  std::vector<std::unique_ptr<Layer>> ep_layers(static_cast<size_t>(P));
  comm::run_local_ranks(P, [&](comm::Communicator& group) {
    const int r = group.rank();
    ep_layers[r] = std::make_unique<Layer>(s, ExpertParallelGroup{&group, r, P}, router_skew);
    ep[r] = run(*ep_layers[r], x.data() + r * kRows * kC, g.data() + r * kRows * kC, kRows);
  });
  const int64_t n = kRows * kC, L = experts / P;
  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The expert-parallel layer holds only its own experts.
    EXPECT_EQ(ep_layers[r]->mlp->local_experts(), L);
    EXPECT_THROW(ep_layers[r]->store.index_of(std::string(kPrefix) + "experts." +
                                              std::to_string((r + 1) % P * L) + ".w1.weight"),
                 Error);
    // Dropless: the one-rank layer on everything; with a capacity: this rank's own layer.
    const float* want_y = capacity > 0 ? own[r].y.data() : all.y.data() + r * n;
    const float* want_dx = capacity > 0 ? own[r].d_x.data() : all.d_x.data() + r * n;
    if (capacity > 0) {
      EXPECT_EQ(ep[r].dropped, own[r].dropped) << "the dropped copies";
      EXPECT_GT(std::count(ep[r].dropped.begin(), ep[r].dropped.end(), true), 0);
      EXPECT_LE(relative_to_max(ep[r].y.data(), want_y, n), 1e-6) << "outputs";
      EXPECT_LE(relative_to_max(ep[r].d_x.data(), want_dx, n), 1e-6) << "input gradients";
    } else {
      EXPECT_EQ(0, std::memcmp(ep[r].y.data(), want_y, sizeof(float) * n)) << "outputs";
      EXPECT_EQ(0, std::memcmp(ep[r].d_x.data(), want_dx, sizeof(float) * n)) << "input gradients";
    }
    for (int64_t j = r * L; j < (r + 1) * L; ++j) {
      for (const char* w : {".w1.weight", ".w3.weight", ".w2.weight"}) {
        const std::string name = "experts." + std::to_string(j) + w;
        const int64_t size = kC * kF;
        if (capacity > 0) {
          // Summed over the P ranks' copies, each from its own layer: the same terms, another
          // association (relative 1e-6).
          std::vector<float> sum(static_cast<size_t>(size), 0.0f);
          for (int q = 0; q < P; ++q)
            for (int64_t i = 0; i < size; ++i) sum[i] += own_layers[q]->grad(name)[i];
          EXPECT_LE(relative_to_max(ep_layers[r]->grad(name), sum.data(), size), 1e-6) << name;
        } else {
          EXPECT_EQ(0, std::memcmp(ep_layers[r]->grad(name), whole.grad(name),
                                   sizeof(float) * static_cast<size_t>(size)))
              << name;
        }
      }
    }
  }
  if (capacity == 0) {  // the router: each rank's tokens' part; summed, the one-rank gradient
    const int64_t size = experts * kC;
    std::vector<float> sum(static_cast<size_t>(size), 0.0f);
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < size; ++i) sum[i] += ep_layers[r]->grad("gate.weight")[i];
    EXPECT_LE(relative_to_max(sum.data(), whole.grad("gate.weight"), size), 1e-6);
  }
}

TEST(MoeExpertParallel, TwoAndFourRanksEqualOneRankDropless) {
  check_expert_parallel(2, 4, 0.0);
  check_expert_parallel(4, 8, 0.0);
  check_expert_parallel(2, 8, 0.0);  // 4 local experts per rank
}

TEST(MoeExpertParallel, WithACapacityEachRankDropsItsOwnCopies) {
  check_expert_parallel(2, 4, 1.0);
  check_expert_parallel(4, 4, 0.75);  // one local expert per rank, fewer slots than copies
}

TEST(MoeExpertParallel, UnevenLoadsAndEmptyExchanges) {
  check_expert_parallel(2, 4, 0.0, /*router_skew=*/3.0f);
  check_expert_parallel(4, 8, 0.0, /*router_skew=*/3.0f);
}

TEST(MoeExpertParallel, ExpertsNotDivisibleByTheGroupAreRefused) {
  try {
    comm::run_local_ranks(3, [&](comm::Communicator& group) {
      ParameterStore store;
      MoeMlp mlp(store, kPrefix, kC, kF, settings(4, 0), MoeNames::mixtral,
                 {&group, group.rank(), 3});
    });
    FAIL() << "4 experts over 3 ranks should be refused";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("model.n_experts = 4 is not divisible by parallelism.ep = 3"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lattice::model
