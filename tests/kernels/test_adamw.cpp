// Tests of the AdamW kernel: against a naive double-precision implementation of torch's formula
// over several steps (weight decay, gradient scaling), bit-exactly against a scalar fp32
// transcription of torch 1.13's operation order, for thread-count independence, and its bf16 copy
// of the updated parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/adamw.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;

struct AdamWState {
  std::vector<float> param, m, v;
};

AdamWState initial_state(int64_t n) {
  return {random_vector(n, 50), std::vector<float>(static_cast<size_t>(n), 0.0f),
          std::vector<float>(static_cast<size_t>(n), 0.0f)};
}

// torch 1.13 _single_tensor_adamw as fp32 tensor operations, one element at a time. fp-contract=off
// so that the compiler does not fuse the separate multiplications and additions torch performs; the
// one fused operation (add_ with alpha, a vectorised fmadd in ATen) is written as std::fma.
__attribute__((optimize("fp-contract=off"))) void torch_fp32_step(AdamWState& s,
                                                                  const std::vector<float>& grad,
                                                                  const AdamWHyper& h, int64_t step,
                                                                  float grad_scale) {
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  const double step_size = h.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < grad.size(); ++i) {
    const float g = grad[i] * grad_scale;
    s.param[i] = s.param[i] * static_cast<float>(1.0 - h.lr * h.weight_decay);
    s.m[i] = std::fma(g, static_cast<float>(1.0 - h.beta1), s.m[i] * static_cast<float>(h.beta1));
    const float scaled = static_cast<float>(1.0 - h.beta2) * g;
    s.v[i] = s.v[i] * static_cast<float>(h.beta2) + scaled * g;
    const float denom =
        std::sqrt(s.v[i]) / static_cast<float>(bias_correction2_sqrt) + static_cast<float>(h.eps);
    s.param[i] = s.param[i] + (static_cast<float>(-step_size) * s.m[i]) / denom;
  }
}

// The same formula with every quantity in double.
struct DoubleState {
  std::vector<double> param, m, v;
};

void double_step(DoubleState& s, const std::vector<float>& grad, const AdamWHyper& h, int64_t step,
                 double grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  for (size_t i = 0; i < grad.size(); ++i) {
    const double g = grad[i] * grad_scale;
    s.param[i] *= 1.0 - h.lr * h.weight_decay;
    s.m[i] = h.beta1 * s.m[i] + (1.0 - h.beta1) * g;
    s.v[i] = h.beta2 * s.v[i] + (1.0 - h.beta2) * g * g;
    s.param[i] -= (h.lr / bc1) * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps);
  }
}

const AdamWHyper kHyper{/*lr=*/1e-2, /*beta1=*/0.9, /*beta2=*/0.95, /*eps=*/1e-8,
                        /*weight_decay=*/0.1};
constexpr int kSteps = 10;

void kernel_step(AdamWState& s, const std::vector<float>& grad, const AdamWHyper& h, int64_t step,
                 float grad_scale) {
  adamw_update(s.param.data(), grad.data(), s.m.data(), s.v.data(),
               static_cast<int64_t>(grad.size()), h, step, grad_scale);
}

TEST(AdamW, MatchesDoubleReferenceOverSeveralSteps) {
  const int64_t n = 16 * 40 + 5;  // full vectors and a masked tail
  const float grad_scale = 0.7f;
  AdamWState s = initial_state(n);
  DoubleState d{std::vector<double>(s.param.begin(), s.param.end()),
                std::vector<double>(static_cast<size_t>(n)),
                std::vector<double>(static_cast<size_t>(n))};
  for (int step = 1; step <= kSteps; ++step) {
    auto grad = random_vector(n, 100 + static_cast<uint64_t>(step));
    kernel_step(s, grad, kHyper, step, grad_scale);
    double_step(d, grad, kHyper, step, grad_scale);
  }
  // Each fp32 operation rounds to within 2^-24 relative. The moments carry about three roundings
  // per step forward, decayed, so they stay within ~1e-7 of their scale (measured 1.4e-7): allow
  // 1e-6. A parameter is rounded twice per step (decay, update) at its own magnitude, so after
  // kSteps it is within 2 * kSteps * 2^-24 * |p| of the double trajectory, plus the update's own
  // error (~1e-7 of lr-sized updates): measured 5.5e-7 on |p| up to 3 against a bound of ~3.6e-6.
  EXPECT_LT(lattice::testing::max_relative_error(s.m, d.m), 1e-6);
  EXPECT_LT(lattice::testing::max_relative_error(s.v, d.v), 1e-6);
  for (size_t i = 0; i < s.param.size(); ++i) {
    const double bound = 2.0 * kSteps * std::ldexp(1.0, -24) * std::fabs(d.param[i]) + 1e-7;
    EXPECT_NEAR(s.param[i], d.param[i], bound) << i;
  }
  // The parameters did move: by roughly lr per step.
  auto start = initial_state(n).param;
  double moved = 0;
  for (size_t i = 0; i < start.size(); ++i)
    moved = std::fmax(moved, std::fabs(s.param[i] - start[i]));
  EXPECT_GT(moved, 5 * kHyper.lr);
}

TEST(AdamW, BitIdenticalToTorchFp32OperationOrder) {
  const int64_t n = 16 * 9 + 11;
  const float grad_scale = 0.37f;
  AdamWState kernel = initial_state(n), torch = initial_state(n);
  for (int step = 1; step <= kSteps; ++step) {
    auto grad = random_vector(n, 200 + static_cast<uint64_t>(step), 1e-3f);
    if (step == 3) grad[5] = 0.0f;  // a zero gradient: denominator leans on eps
    kernel_step(kernel, grad, kHyper, step, grad_scale);
    torch_fp32_step(torch, grad, kHyper, step, grad_scale);
  }
  EXPECT_EQ(kernel.param, torch.param);
  EXPECT_EQ(kernel.m, torch.m);
  EXPECT_EQ(kernel.v, torch.v);
}

TEST(AdamW, ZeroGradientOnlyDecaysWeights) {
  const int64_t n = 21;
  AdamWState s = initial_state(n);
  const auto before = s.param;
  kernel_step(s, std::vector<float>(static_cast<size_t>(n), 0.0f), kHyper, 1, 1.0f);
  const float decay = static_cast<float>(1.0 - kHyper.lr * kHyper.weight_decay);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(s.param[i], before[i] * decay);
}

TEST(AdamW, GradScaleEqualsPrescaledGradient) {
  const int64_t n = 100;
  const float grad_scale = 0.123f;
  auto grad = random_vector(n, 300);
  std::vector<float> prescaled(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) prescaled[i] = grad[i] * grad_scale;
  AdamWState a = initial_state(n), b = initial_state(n);
  kernel_step(a, grad, kHyper, 1, grad_scale);
  kernel_step(b, prescaled, kHyper, 1, 1.0f);
  EXPECT_EQ(a.param, b.param);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
}

TEST(AdamW, IndependentOfThreadCount) {
  const int64_t n = 3 * (1 << 14) + 9;  // several parallel chunks
  auto grad = random_vector(n, 400);
  std::vector<AdamWState> results;
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    AdamWState s = initial_state(n);
    kernel_step(s, grad, kHyper, 1, 1.0f);
    kernel_step(s, grad, kHyper, 2, 1.0f);
    results.push_back(std::move(s));
  }
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_EQ(results[r].param, results[0].param);
    EXPECT_EQ(results[r].v, results[0].v);
  }
}

TEST(AdamW, Bf16CopyIsTheRoundedUpdateAndChangesNothingElse) {
  // Several parallel chunks, rounding blocks and a masked tail; a denormal, a NaN and a value on a
  // bf16 rounding boundary among the parameters (their updates keep them near where they are).
  const int64_t n = 2 * (1 << 14) + 1024 + 7;
  auto grad = random_vector(n, 500, 1e-3f);
  for (int threads : {1, 2}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    AdamWState plain = initial_state(n), copied = initial_state(n);
    for (AdamWState* s : {&plain, &copied}) {
      s->param[3] = 1e-39f;
      s->param[4] = std::nanf("");
      s->param[5] = 1.0f + 0x1p-8f;  // halfway between two bf16 values before the update
    }
    std::vector<lattice::bf16> copy(static_cast<size_t>(n), lattice::bf16{0x1234});
    for (int step = 1; step <= 2; ++step) {
      kernel_step(plain, grad, kHyper, step, 0.5f);
      adamw_update(copied.param.data(), grad.data(), copied.m.data(), copied.v.data(), n, kHyper,
                   step, 0.5f, copy.data());
    }
    // The fp32 state is bit-identical with or without the copy (NaN compared by bits).
    ASSERT_EQ(0, std::memcmp(plain.param.data(), copied.param.data(), plain.param.size() * 4));
    EXPECT_EQ(plain.m, copied.m);
    EXPECT_EQ(plain.v, copied.v);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(copy[static_cast<size_t>(i)].bits,
                lattice::to_bf16(copied.param[static_cast<size_t>(i)]).bits)
          << "element " << i << ", " << threads << " threads";
  }
}

TEST(AdamW, TensorsInOneLoopEqualOneCallEach) {
  // Sizes below, at and above a chunk, an empty one; decay on some, a bf16 copy on some.
  const std::vector<int64_t> sizes = {5, 1 << 14, 0, 3 * (1 << 14) + 77, 1000};
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    std::vector<AdamWState> each, together;
    std::vector<std::vector<float>> grads;
    std::vector<std::vector<lattice::bf16>> copies_each, copies_together;
    for (size_t t = 0; t < sizes.size(); ++t) {
      each.push_back(initial_state(sizes[t]));
      together.push_back(initial_state(sizes[t]));
      grads.push_back(random_vector(sizes[t], 600 + t));
      copies_each.emplace_back(static_cast<size_t>(sizes[t]));
      copies_together.emplace_back(static_cast<size_t>(sizes[t]));
    }
    auto hyper = [&](size_t t) {
      AdamWHyper h = kHyper;
      h.weight_decay = t % 2 == 0 ? 0.1 : 0.0;
      return h;
    };
    for (int step = 1; step <= 2; ++step) {
      std::vector<AdamWTensor> tensors;
      for (size_t t = 0; t < sizes.size(); ++t) {
        lattice::bf16* copy = t % 2 == 1 ? copies_each[t].data() : nullptr;
        adamw_update(each[t].param.data(), grads[t].data(), each[t].m.data(), each[t].v.data(),
                     sizes[t], hyper(t), step, 0.75f, copy);
        tensors.push_back({together[t].param.data(), grads[t].data(), together[t].m.data(),
                           together[t].v.data(), t % 2 == 1 ? copies_together[t].data() : nullptr,
                           sizes[t], hyper(t)});
      }
      adamw_update_tensors(tensors, step, 0.75f);
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      EXPECT_EQ(each[t].param, together[t].param)
          << "tensor " << t << ", " << threads << " threads";
      EXPECT_EQ(each[t].m, together[t].m) << "tensor " << t;
      EXPECT_EQ(each[t].v, together[t].v) << "tensor " << t;
      for (size_t i = 0; i < copies_each[t].size(); ++i)
        ASSERT_EQ(copies_each[t][i].bits, copies_together[t][i].bits) << "tensor " << t;
    }
  }
  EXPECT_THROW(adamw_update_tensors({}, 0), Error);
}

TEST(AdamW, RejectsStepZero) {
  AdamWState s = initial_state(4);
  std::vector<float> grad(4, 1.0f);
  EXPECT_THROW(kernel_step(s, grad, kHyper, 0, 1.0f), Error);
  adamw_update(nullptr, nullptr, nullptr, nullptr, 0, kHyper, 1);  // empty: no-op
}

}  // namespace
}  // namespace lattice::kernels
