// The one-rank mixture-of-experts MLP (fp32): its output equals a direct per-token loop over the
// chosen experts (the router's weights times each expert's SwiGLU MLP), dropped copies add
// nothing, and its input and parameter gradients match central differences of the loss
// <g, y(x)> wherever the perturbation leaves every token's choice unchanged; dropless and with a
// capacity, softmax and sigmoid routers; Mixtral's parameter names.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "../kernels/gradcheck.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/moe_mlp.hpp"

namespace lattice::model {
namespace {

using testing::random_vector;

struct Layer {
  ParameterStore store;
  MoeMlp mlp;
  Layer(int64_t C, int64_t F, const MoeSettings& s)
      : mlp(store, "model.layers.0.block_sparse_moe.", C, F, s) {
    store.allocate(nullptr);
    store.initialize(11, 0.3f, 1);
  }
};

double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

// Central differences of `loss` (which sets *same_routing to false when its forward routed
// differently) against `analytic`, for each of `values`' n elements whose step keeps the routing.
// fp32 forward, step 1e-2 on values of order 1: relative 2e-3 (the second-order term of the SwiGLU
// and softmax, ~h²·|f'''|, and fp32 rounding over h).
void expect_gradient(const std::function<double()>& loss, bool* same_routing, float* values,
                     const float* analytic, int64_t n, const char* what) {
  int64_t checked = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    *same_routing = true;
    const double numeric = testing::numerical_gradient(loss, values + i, 1, 1e-2f)[0];
    if (!*same_routing) continue;  // the step crossed a routing boundary
    ++checked;
    worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
  }
  EXPECT_LT(worst, 2e-3) << what;
  EXPECT_GT(checked, n / 2) << what;
}

TEST(MoeMlp, EqualsADirectLoopOverEachTokensExperts) {
  const int64_t C = 8, F = 12, rows = 40;
  for (double factor : {0.0, 1.0}) {
    SCOPED_TRACE(factor);
    MoeSettings s;
    s.experts = 4;
    s.top_k = 2;
    s.capacity_factor = factor;
    Layer layer(C, F, s);
    EXPECT_EQ(layer.store.index_of("model.layers.0.block_sparse_moe.experts.3.w2.weight") >= 0,
              true);
    kernels::CpuOps ops;
    const LayerContext ctx{ops};
    const std::vector<float> x = random_vector(rows * C, 1);
    std::vector<float> y(rows * C);
    MoeMlpActivations a;
    layer.mlp.forward(ctx, a, y.data(), x.data(), rows);
    if (factor > 0) EXPECT_GT(a.dispatch.dropped, 0);  // capacity 20 of 80 copies on 4 experts
    const ParameterStore& p = layer.store;
    const std::string pre = "model.layers.0.block_sparse_moe.experts.";
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<double> want(C, 0.0);
      for (int64_t k = 0; k < s.top_k; ++k) {
        if (a.dispatch.slot_of[t * s.top_k + k] < 0) continue;  // dropped: adds nothing
        const int e = a.experts[t * s.top_k + k];
        const float* w1 = p.value(p.index_of(pre + std::to_string(e) + ".w1.weight"));
        const float* w3 = p.value(p.index_of(pre + std::to_string(e) + ".w3.weight"));
        const float* w2 = p.value(p.index_of(pre + std::to_string(e) + ".w2.weight"));
        std::vector<double> h(F);
        for (int64_t f = 0; f < F; ++f) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < C; ++c) {
            g += static_cast<double>(w1[f * C + c]) * x[t * C + c];
            u += static_cast<double>(w3[f * C + c]) * x[t * C + c];
          }
          h[f] = silu(g) * u;
        }
        for (int64_t c = 0; c < C; ++c) {
          double o = 0;
          for (int64_t f = 0; f < F; ++f) o += static_cast<double>(w2[c * F + f]) * h[f];
          want[c] += a.weights.f32()[t * s.top_k + k] * o;
        }
      }
      for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(y[t * C + c], want[c], 1e-5) << t << " " << c;
    }
  }
}

TEST(MoeMlp, GradientsMatchCentralDifferences) {
  const int64_t C = 6, F = 10, rows = 12;
  for (kernels::RouterScore score : {kernels::RouterScore::softmax, kernels::RouterScore::sigmoid})
    for (double factor : {0.0, 1.5}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(score)) + " " + std::to_string(factor));
      MoeSettings s;
      s.experts = 4;
      s.top_k = 2;
      s.score = score;
      s.capacity_factor = factor;
      Layer layer(C, F, s);
      kernels::CpuOps ops;
      const LayerContext ctx{ops};
      std::vector<float> x = random_vector(rows * C, 2);
      const std::vector<float> g = random_vector(rows * C, 3);
      std::vector<float> y(rows * C), d_x(rows * C);
      MoeMlpActivations a;
      layer.mlp.forward(ctx, a, y.data(), x.data(), rows);
      const std::vector<int32_t> choice = a.experts;
      const std::vector<int32_t> slots = a.dispatch.slot_of;
      layer.store.zero_grads();
      layer.mlp.backward(ctx, a, d_x.data(), g.data(), x.data(), rows);
      // The loss, and whether the routing (choices and drops) is what it was.
      bool same_routing = true;
      const auto loss = [&]() {
        MoeMlpActivations b;
        std::vector<float> out(rows * C);
        layer.mlp.forward(ctx, b, out.data(), x.data(), rows);
        same_routing = same_routing && b.experts == choice && b.dispatch.slot_of == slots;
        return testing::weighted_sum(out, g);
      };
      const auto check = [&](float* values, const float* analytic, int64_t n, const char* what) {
        expect_gradient(loss, &same_routing, values, analytic, n, what);
      };
      check(x.data(), d_x.data(), rows * C, "d_x");
      ParameterStore& p = layer.store;
      for (const char* name :
           {"gate.weight", "experts.1.w1.weight", "experts.2.w3.weight", "experts.0.w2.weight"}) {
        const int index = p.index_of(std::string("model.layers.0.block_sparse_moe.") + name);
        const std::vector<float> analytic(p.grad(index), p.grad(index) + p.info(index).numel);
        check(p.mutable_value(index), analytic.data(), p.info(index).numel, name);
      }
    }
}

TEST(MoeMlp, BalancingLossesAndTheirGradients) {
  // A perfectly balanced router (4 experts, top 2: every score 1/4, every expert chosen for a
  // quarter of the copies, f_e = 1/4) gives aux = α; and the gradients of <g, y> + aux + z match
  // central differences of that total where the routing stays.
  const int64_t C = 6, F = 8, rows = 16;
  MoeSettings s;
  s.experts = 4;
  s.top_k = 2;
  // Coefficients large enough that their gradients stand out of the check's tolerance.
  const MoeBalancing balancing{1.0, 0.1};
  {
    MoeMlpActivations a;
    a.counts = {8, 8, 8, 8};
    a.score_sums = {4, 4, 4, 4};  // 16 tokens x 1/4
    a.z_sum = 16 * std::pow(std::log(4.0), 2);
    const MoeLossTerms t = moe_balancing_losses(a, rows, s, balancing, 1.0f);
    EXPECT_NEAR(t.aux, 1.0, 1e-12);
    EXPECT_NEAR(t.z, 0.1 * std::pow(std::log(4.0), 2), 1e-12);
  }
  Layer layer(C, F, s);
  kernels::CpuOps ops;
  const LayerContext ctx{ops};
  std::vector<float> x = random_vector(rows * C, 4);
  const std::vector<float> g = random_vector(rows * C, 5);
  std::vector<float> y(rows * C), d_x(rows * C);
  MoeMlpActivations a;
  layer.mlp.forward(ctx, a, y.data(), x.data(), rows);
  const MoeLossTerms terms = moe_balancing_losses(a, rows, s, balancing, 1.0f);
  EXPECT_GT(terms.aux, 0);
  EXPECT_GT(terms.z, 0);
  layer.store.zero_grads();
  layer.mlp.backward(ctx, a, d_x.data(), g.data(), x.data(), rows, terms.gradients());
  const std::vector<int32_t> choice = a.experts;
  bool same_routing = true;
  // The loads f_e are constants of the step (Switch): the total with this forward's counts.
  const std::vector<int64_t> counts = a.counts;
  const auto total = [&]() {
    MoeMlpActivations b;
    std::vector<float> out(rows * C);
    layer.mlp.forward(ctx, b, out.data(), x.data(), rows);
    same_routing = same_routing && b.experts == choice;
    b.counts = counts;
    const MoeLossTerms t = moe_balancing_losses(b, rows, s, balancing, 1.0f);
    return testing::weighted_sum(out, g) + t.aux + t.z;
  };
  const int router = layer.store.index_of("model.layers.0.block_sparse_moe.gate.weight");
  const std::vector<float> d_router(layer.store.grad(router),
                                    layer.store.grad(router) + layer.store.info(router).numel);
  const auto check = [&](float* values, const float* analytic, int64_t n, const char* what) {
    expect_gradient(total, &same_routing, values, analytic, n, what);
  };
  check(x.data(), d_x.data(), rows * C, "d_x");
  check(layer.store.mutable_value(router), d_router.data(), layer.store.info(router).numel,
        "router");
}

TEST(MoeMlp, RefusesWhatCannotRoute) {
  ParameterStore store;
  MoeSettings s;
  s.experts = 2;
  s.top_k = 3;
  EXPECT_THROW(MoeMlp(store, "m.", 4, 4, s), Error);
  s.top_k = 1;
  s.capacity_factor = -1;
  EXPECT_THROW(MoeMlp(store, "n.", 4, 4, s), Error);
}

}  // namespace
}  // namespace lattice::model
