// Tests of the Linear layer's bf16 input reuse: a bf16 forward keeps its rounded input and the
// backward that follows uses it (and forward_prepared, whose input was written directly in bf16 by
// gelu_forward_bf16), with results bit-identical to the MatmulEngine rounding every operand itself;
// the kept bytes are tracked as activations and freed by LinearActivations::release; and the
// backward split into its input (B) and weight (W) halves equals the whole backward bit for bit.
#include <gtest/gtest.h>

#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/model/parameter_store.hpp"
#include "random_values.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

using lattice::testing::random_values;

struct Gradients {
  std::vector<float> d_in, d_weight, d_bias;
};

}  // namespace

TEST(LinearBf16, KeptAndPreparedInputsGiveTheEngineResultsBitForBit) {
  const int64_t rows = 67, in = 96, out = 40;
  ParameterStore store;
  Linear layer(store, "fc", in, out, true, InitKind::normal);
  MemoryTracker tracker;
  store.allocate(nullptr);
  store.initialize(1, 0.5f, 1);
  kernels::CpuOps ops;
  const LayerContext ctx{ops, kernels::Precision::bf16, &tracker};
  LinearActivations saved;
  const auto pre_activation = random_values(rows * in, 2, 3.0f);
  std::vector<float> x(pre_activation.size());
  kernels::gelu_forward(x.data(), pre_activation.data(), rows * in);
  const auto d_out = random_values(rows * out, 3, 1.0f);
  const float* weight = store.value(store.index_of("fc.weight"));
  const float* bias = store.value(store.index_of("fc.bias"));

  // Reference: the engine rounding x, the weight and d_out itself.
  std::vector<float> ref_out(static_cast<size_t>(rows * out));
  Gradients ref{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(out * in)),
                std::vector<float>(static_cast<size_t>(out))};
  kernels::MatmulEngine reference_engine;
  reference_engine.forward(ref_out.data(), x.data(), weight, bias, rows, in, out,
                           kernels::Precision::bf16);
  reference_engine.backward(ref.d_in.data(), ref.d_weight.data(), ref.d_bias.data(), d_out.data(),
                            x.data(), weight, rows, in, out, kernels::Precision::bf16);

  // 1. forward on the fp32 input, backward on the same input: uses the kept copy.
  std::vector<float> y(ref_out.size());
  layer.forward(ctx, saved, y.data(), x.data(), rows);
  EXPECT_EQ(tracker.current(MemoryCategory::activations), rows * in * 2);
  EXPECT_EQ(y, ref_out);
  store.zero_grads();
  std::vector<float> d_in(x.size());
  layer.backward(ctx, saved, d_in.data(), d_out.data(), x.data(), rows);
  EXPECT_EQ(d_in, ref.d_in);
  EXPECT_EQ(std::vector<float>(store.grad(store.index_of("fc.weight")),
                               store.grad(store.index_of("fc.weight")) + out * in),
            ref.d_weight);

  // 2. the input written directly in bf16 by the fused GELU; backward is given no fp32 input.
  std::vector<lattice::bf16> slope(static_cast<size_t>(rows * in));  // not used here
  kernels::gelu_forward_bf16_with_slope(layer.prepare_bf16_input(ctx, saved, rows), slope.data(),
                                        pre_activation.data(), rows * in);
  std::fill(y.begin(), y.end(), 0.0f);
  layer.forward_prepared(ctx, saved, y.data(), rows);
  EXPECT_EQ(y, ref_out);
  store.zero_grads();
  layer.backward(ctx, saved, d_in.data(), d_out.data(), nullptr, rows);
  EXPECT_EQ(d_in, ref.d_in);
  EXPECT_EQ(std::vector<float>(store.grad(store.index_of("fc.bias")),
                               store.grad(store.index_of("fc.bias")) + out),
            ref.d_bias);
  // A backward over other rows cannot use the prepared input and has no fp32 one: refused.
  EXPECT_THROW(layer.backward(ctx, saved, d_in.data(), d_out.data(), nullptr, rows - 1), Error);

  saved.release();
  EXPECT_EQ(tracker.current(MemoryCategory::activations), 0);
}

TEST(LinearBf16, ABackwardOnAnotherInputRoundsThatInput) {
  // The kept copy belongs to the forward's input; a backward given another buffer must not use it.
  const int64_t rows = 9, in = 16, out = 8;
  ParameterStore store;
  Linear layer(store, "fc", in, out, false, InitKind::normal);
  store.allocate(nullptr);
  store.initialize(4, 0.5f, 1);
  kernels::CpuOps ops;
  const LayerContext ctx{ops, kernels::Precision::bf16, nullptr};
  LinearActivations saved;
  const auto a = random_values(rows * in, 5, 1.0f), b = random_values(rows * in, 6, 1.0f);
  const auto d_out = random_values(rows * out, 7, 1.0f);
  std::vector<float> y(static_cast<size_t>(rows * out)), ref_dw(static_cast<size_t>(out * in));
  layer.forward(ctx, saved, y.data(), a.data(), rows);
  layer.backward(ctx, saved, nullptr, d_out.data(), b.data(), rows);
  kernels::MatmulEngine reference_engine;
  reference_engine.backward(nullptr, ref_dw.data(), nullptr, d_out.data(), b.data(), store.value(0),
                            rows, in, out, kernels::Precision::bf16);
  EXPECT_EQ(std::vector<float>(store.grad(0), store.grad(0) + out * in), ref_dw);
}

// B then W equals the whole backward bit for bit, fp32 and bf16 (with and without a bias, the
// input kept by forward or written by a producer), on shapes that take the engine's oneDNN paths
// and, where the CPU has AMX, its AMX kernels (multiples of 32, at least 256 rows).
class LinearHalves
    : public ::testing::TestWithParam<std::tuple<kernels::Precision, bool, int64_t>> {};

TEST_P(LinearHalves, InputThenWeightHalvesEqualTheWholeBackward) {
  const auto [precision, with_bias, rows] = GetParam();
  const int64_t in = 64, out = 96;
  ParameterStore store;
  Linear layer(store, "fc", in, out, with_bias, InitKind::normal);
  store.allocate(nullptr);
  store.initialize(11, 0.5f, 1);
  kernels::CpuOps ops;
  const LayerContext ctx{ops, precision, nullptr};
  const auto x = random_values(rows * in, 12, 1.0f), d_out = random_values(rows * out, 13, 1.0f);
  std::vector<float> y(static_cast<size_t>(rows * out));
  const int w = store.index_of("fc.weight");
  auto grads = [&] {
    Gradients g{std::vector<float>(static_cast<size_t>(rows * in)),
                std::vector<float>(store.grad(w), store.grad(w) + out * in),
                {}};
    if (with_bias) {
      const float* b = store.grad(store.index_of("fc.bias"));
      g.d_bias.assign(b, b + out);
    }
    return g;
  };
  // Gradients accumulate onto non-zero values, as over microbatches.
  auto start = [&] {
    for (int64_t i = 0; i < store.size(); ++i) store.grads()[i] = 0.25f;
  };
  LinearActivations saved;
  start();
  layer.forward(ctx, saved, y.data(), x.data(), rows);
  Gradients whole = grads();
  layer.backward(ctx, saved, whole.d_in.data(), d_out.data(), x.data(), rows);
  const Gradients whole_done = [&] {
    Gradients g = grads();
    g.d_in = whole.d_in;
    return g;
  }();

  start();
  LinearActivations saved2;
  layer.forward(ctx, saved2, y.data(), x.data(), rows);
  std::vector<float> d_in(static_cast<size_t>(rows * in), -1.0f);
  layer.backward_input(ctx, saved2, d_in.data(), d_out.data(), rows);
  // B leaves the weight and bias gradients untouched.
  EXPECT_EQ(grads().d_weight, std::vector<float>(static_cast<size_t>(out * in), 0.25f));
  layer.backward_weight(ctx, saved2, d_out.data(), x.data(), rows);
  Gradients split = grads();
  EXPECT_EQ(d_in, whole_done.d_in);
  EXPECT_EQ(split.d_weight, whole_done.d_weight);
  EXPECT_EQ(split.d_bias, whole_done.d_bias);
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionBiasRows, LinearHalves,
    ::testing::Combine(::testing::Values(kernels::Precision::fp32, kernels::Precision::bf16),
                       ::testing::Bool(), ::testing::Values<int64_t>(37, 512)));
