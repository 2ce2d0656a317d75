// Test helper: a transformer block of a description on its own store with random weights, and the
// check that its parameter and input gradients (fp32) match central differences of its forward.
// Shared by the block tests (test_transformer_block.cpp) and the components' own
// (test_latent_attention.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/block_description.hpp"
#include "lattice/model/transformer_block.hpp"

namespace lattice::testing {

// A block of `d` with every parameter uniform in [-0.3, 0.3) (biases and norm weights too, so that
// every gradient term is visible).
struct RandomizedBlock {
  model::ParameterStore store;
  std::unique_ptr<model::TransformerBlock> block;

  RandomizedBlock(const model::BlockDescription& d, const kernels::RopeTable* rope) {
    block =
        std::make_unique<model::TransformerBlock>(store, d, 0, parallel::SequenceLayout{}, rope);
    store.allocate(nullptr);
    Rng rng(5);
    for (int64_t i = 0; i < store.size(); ++i)
      store.mutable_values()[i] = 0.3f * static_cast<float>(rng.uniform() * 2 - 1);
    store.zero_grads();
  }
};

// Uniform values in [-1, 1).
inline std::vector<float> uniform_values(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform() * 2 - 1);
  return v;
}

// loss = Σ out · weights: its gradient at the output is `weights`.
inline double weighted_block_output(model::TransformerBlock& block, const model::LayerContext& ctx,
                                    const float* x, const std::vector<float>& weights, int64_t B,
                                    int64_t T) {
  auto saved = block.make_activations();
  std::vector<float> out(weights.size());
  block.forward(ctx, *saved, out.data(), x, B, T);
  double loss = 0;
  for (size_t i = 0; i < out.size(); ++i) loss += static_cast<double>(out[i]) * weights[i];
  return loss;
}

// The block's parameter gradients (3 random elements of each parameter) and input gradients (3
// elements) against central differences of its forward, fp32, B = 2 sequences of T = 7 tokens.
inline void expect_block_gradients_match_finite_differences(const model::BlockDescription& d,
                                                            const kernels::RopeTable* rope) {
  RandomizedBlock t(d, rope);
  kernels::CpuOps ops;
  model::LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t B = 2, T = 7, n = B * T * d.d_model;
  std::vector<float> x = uniform_values(n, 1), weights = uniform_values(n, 2);
  auto saved = t.block->make_activations();
  std::vector<float> out(static_cast<size_t>(n)), d_x(static_cast<size_t>(n));
  t.block->forward(ctx, *saved, out.data(), x.data(), B, T);
  model::BackwardScratch scratch;
  t.block->backward(ctx, *saved, d_x.data(), weights.data(), x.data(), B, T, scratch);
  const std::vector<float> analytic(t.store.grads(), t.store.grads() + t.store.size());

  // fp32 evaluation noise (~1e-6 of a loss of order 1) over 2·step = 0.02 gives ~5e-5, the
  // truncation term is of the same order: 3e-4 absolute + 2% relative.
  const float step = 1e-2f;
  Rng pick(3);
  int checked = 0;
  for (const auto& p : t.store.parameters()) {
    for (int probe = 0; probe < 3; ++probe) {
      const int64_t index =
          p.offset + static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.numel)));
      auto value = [&]() -> float& { return t.store.mutable_values()[index]; };
      const float kept = value();
      value() = kept + step;
      const double plus = weighted_block_output(*t.block, ctx, x.data(), weights, B, T);
      value() = kept - step;
      const double minus = weighted_block_output(*t.block, ctx, x.data(), weights, B, T);
      value() = kept;
      const double numeric = (plus - minus) / (2.0 * step);
      EXPECT_NEAR(analytic[static_cast<size_t>(index)], numeric, 3e-4 + 0.02 * std::fabs(numeric))
          << p.name << " element " << index - p.offset;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(t.store.parameters().size()));
  for (int64_t i : {int64_t{0}, n / 3, n - 1}) {  // the input gradient too
    std::vector<float> probe = x;
    probe[static_cast<size_t>(i)] += step;
    const double plus = weighted_block_output(*t.block, ctx, probe.data(), weights, B, T);
    probe[static_cast<size_t>(i)] -= 2 * step;
    const double minus = weighted_block_output(*t.block, ctx, probe.data(), weights, B, T);
    const double numeric = (plus - minus) / (2.0 * step);
    EXPECT_NEAR(d_x[static_cast<size_t>(i)], numeric, 3e-4 + 0.02 * std::fabs(numeric)) << i;
  }
}

}  // namespace lattice::testing
