// Tests of Linear::forward_shared_rows / backward_shared, the bf16 path where several Linears read
// one bf16 input rounded once (Llama's q, k, v and SwiGLU's gate and up behind
// rmsnorm_forward_bf16): outputs, input gradients and weight and bias gradients must equal, bit for
// bit, the unfused sequence (rmsnorm_forward in fp32, then each Linear's forward rounding that
// output itself, and its backward), in one piece or two (the second read from another buffer), with
// the backward whole or as its input and weight halves.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/linear.hpp"
#include "lattice/model/parameter_store.hpp"
#include "random_values.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

using lattice::testing::random_values;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Three Linears reading one input of width C (the second with a bias, as Qwen 2's k_proj), run
// either way; returns their outputs, the summed input gradient and every parameter gradient.
struct SharedRun {
  std::vector<float> out, d_in, grads;
};

SharedRun run_linears(bool shared, bool halves, bool pieces, bool bf16_copies, int64_t rows) {
  const int64_t C = 96, widths[3] = {64, 32, 32};
  ParameterStore store;
  std::vector<Linear> layers;
  for (int i = 0; i < 3; ++i)
    layers.emplace_back(store, "p" + std::to_string(i), C, widths[i], i == 1, InitKind::normal);
  const int norm_weight = store.declare("norm.weight", {C}, InitKind::ones, false);
  store.allocate(nullptr);
  store.initialize(3, 0.5f, 1);
  if (bf16_copies) store.keep_bf16_copies(nullptr);
  store.zero_grads();
  kernels::CpuOps ops;
  const LayerContext ctx{ops, kernels::Precision::bf16, nullptr};
  const auto x = random_values(rows * C, 5, 2.0f);
  std::vector<float> rstd(static_cast<size_t>(rows));
  std::vector<LinearActivations> saved(3);
  std::vector<std::vector<float>> out(3), d_out(3);
  for (int i = 0; i < 3; ++i) {
    out[i].assign(static_cast<size_t>(rows * widths[i]), 0.0f);
    d_out[i] = random_values(rows * widths[i], 11 + i, 1.0f);
  }
  const float* w = store.value(norm_weight);
  std::vector<float> normed;  // unfused: the fp32 norm output
  const lattice::bf16* in16 = nullptr;
  std::vector<lattice::bf16> own16;  // pieces: the first piece's rows from another buffer
  const int64_t first = pieces ? rows / 3 : 0;
  if (shared) {
    lattice::bf16* buffer = layers[0].prepare_bf16_input(ctx, saved[0], rows);
    ops.rmsnorm_forward_bf16(buffer, rstd.data(), x.data(), w, rows, C, 1e-6f);
    in16 = buffer;
    own16.assign(buffer, buffer + first * C);
  } else {
    normed.resize(x.size());
    ops.rmsnorm_forward(normed.data(), rstd.data(), x.data(), w, rows, C, 1e-6f);
  }
  for (int i = 0; i < 3; ++i) {
    if (shared) {
      if (pieces)
        layers[i].forward_shared_rows(ctx, saved[i], out[i].data(), in16, rows, 0, first,
                                      own16.data());
      layers[i].forward_shared_rows(ctx, saved[i], out[i].data(), in16, rows, first, rows - first);
    } else {
      if (pieces)
        layers[i].forward_rows(ctx, saved[i], out[i].data(), normed.data(), rows, 0, first);
      layers[i].forward_rows(ctx, saved[i], out[i].data(), normed.data(), rows, first,
                             rows - first);
    }
  }
  SharedRun r;
  r.d_in.assign(x.size(), 0.0f);
  std::vector<float> part(x.size());
  for (int i = 0; i < 3; ++i) {
    float* d_in = i == 0 ? r.d_in.data() : part.data();
    if (shared) {
      layers[i].backward_shared(ctx, saved[i], d_in, d_out[i].data(), halves ? nullptr : in16,
                                rows);
      if (halves) layers[i].backward_shared(ctx, saved[i], nullptr, d_out[i].data(), in16, rows);
    } else if (halves) {
      layers[i].backward_input(ctx, saved[i], d_in, d_out[i].data(), rows);
      layers[i].backward_weight(ctx, saved[i], d_out[i].data(), normed.data(), rows);
    } else {
      layers[i].backward(ctx, saved[i], d_in, d_out[i].data(), normed.data(), rows);
    }
    if (i > 0) ops.add_inplace(r.d_in.data(), part.data(), rows * C);
  }
  for (int i = 0; i < 3; ++i) r.out.insert(r.out.end(), out[i].begin(), out[i].end());
  r.grads.assign(store.grads(), store.grads() + store.size());
  return r;
}

}  // namespace

// (halves, pieces, bf16 copies of the weights, rows): 300 rows take the engine's row-chunked
// paths (256-row chunks and a tail), 37 the unchunked ones.
class LinearSharedInput : public ::testing::TestWithParam<std::tuple<bool, bool, bool, int64_t>> {};

TEST_P(LinearSharedInput, EqualsEachLinearRoundingTheFp32NormOutputBitForBit) {
  const auto [halves, pieces, copies, rows] = GetParam();
  const SharedRun unfused = run_linears(false, halves, pieces, copies, rows);
  const SharedRun fused = run_linears(true, halves, pieces, copies, rows);
  EXPECT_TRUE(same_bits(fused.out, unfused.out));
  EXPECT_TRUE(same_bits(fused.d_in, unfused.d_in));
  EXPECT_TRUE(same_bits(fused.grads, unfused.grads));
  int64_t nonzero = 0;
  for (float g : fused.grads) nonzero += g != 0.0f;
  EXPECT_GT(nonzero, static_cast<int64_t>(fused.grads.size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearSharedInput,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(int64_t{37}, int64_t{300})));

TEST(LinearSharedInputChecks, BackwardSharedNeedsAForwardSharedOfTheSameRows) {
  ParameterStore store;
  Linear layer(store, "fc", 16, 8, false, InitKind::normal);
  store.allocate(nullptr);
  store.initialize(1, 0.5f, 1);
  kernels::CpuOps ops;
  const LayerContext bf16{ops, kernels::Precision::bf16, nullptr};
  const LayerContext fp32{ops, kernels::Precision::fp32, nullptr};
  LinearActivations saved;
  std::vector<lattice::bf16> in16(4 * 16);
  std::vector<float> out(4 * 8), d_out(4 * 8, 1.0f), d_in(4 * 16);
  EXPECT_THROW(layer.forward_shared_rows(fp32, saved, out.data(), in16.data(), 4, 0, 4), Error);
  EXPECT_THROW(layer.backward_shared(bf16, saved, d_in.data(), d_out.data(), in16.data(), 4),
               Error);
  layer.forward_shared_rows(bf16, saved, out.data(), in16.data(), 4, 0, 4);
  EXPECT_THROW(layer.backward_shared(bf16, saved, d_in.data(), d_out.data(), in16.data(), 3),
               Error);
  EXPECT_NO_THROW(layer.backward_shared(bf16, saved, d_in.data(), d_out.data(), in16.data(), 4));
}
