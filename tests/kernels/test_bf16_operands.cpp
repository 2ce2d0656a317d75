// Tests of the bf16 operands that kernels hand each other instead of rounding fp32 values again:
// the cross-entropy's bf16 logits gradient, the Linear forward's kept bf16 input and weight, and a
// backward fed with pre-rounded operands. Each must equal, bit for bit, the path that rounds fp32
// values (lattice::to_bf16 of the fp32 results) -- the reference is the existing fp32-output
// kernel.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;

std::vector<uint16_t> bf16_bits_of(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = lattice::to_bf16(values[i]).bits;
  return bits;
}

std::vector<uint16_t> bits_of(const std::vector<lattice::bf16>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = values[i].bits;
  return bits;
}

TEST(CrossEntropyBf16, GradientIsTheRoundedFp32GradientAndTheLossIsTheSame) {
  struct Shape {
    int64_t rows, V;
  };
  for (const Shape s : {Shape{1, 1}, Shape{3, 33}, Shape{7, 768}, Shape{3, 50257}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " V=" << s.V);
    // Spread logits (some far below the max: tiny probabilities, denormal-range gradients).
    const auto logits = random_vector(s.rows * s.V, 11, 30.0f);
    std::vector<int32_t> targets(static_cast<size_t>(s.rows));
    Rng rng(5);
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(s.V)));
    if (s.rows >= 3) targets[1] = -1;  // ignored row
    for (int threads : {1, 2}) {
      lattice::testing::ScopedOmpThreads scope(threads);
      std::vector<float> fp32_grad(logits.size());
      const double loss = cross_entropy_forward_backward(fp32_grad.data(), logits.data(),
                                                         targets.data(), s.rows, s.V, 0.37f);
      std::vector<float> scratch = logits;
      std::vector<lattice::bf16> bf16_grad(logits.size(), lattice::bf16{0xffff});
      const double loss16 = cross_entropy_forward_backward_bf16(bf16_grad.data(), scratch.data(),
                                                                targets.data(), s.rows, s.V, 0.37f);
      EXPECT_EQ(loss, loss16);
      EXPECT_EQ(bits_of(bf16_grad), bf16_bits_of(fp32_grad)) << threads << " threads";
    }
  }
}

TEST(GeluBf16, ForwardIsTheRoundedFp32Forward) {
  // Inputs across GELU's regimes: large negative (output ~ -0, denormal), around 0, large positive;
  // n not a multiple of the block or vector size, and above the threading threshold.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{70001}}) {
    auto x = random_vector(n, 9, 12.0f);
    if (n > 3) x[0] = -88.0f, x[1] = 0.0f, x[2] = 1e-39f;
    std::vector<float> fp32(static_cast<size_t>(n));
    gelu_forward(fp32.data(), x.data(), n);
    for (int threads : {1, 2}) {
      lattice::testing::ScopedOmpThreads scope(threads);
      std::vector<lattice::bf16> out(static_cast<size_t>(n));
      gelu_forward_bf16(out.data(), x.data(), n);
      EXPECT_EQ(bits_of(out), bf16_bits_of(fp32)) << "n=" << n << ", " << threads << " threads";
    }
  }
}

TEST(MatmulBf16Operands, KeptForwardCopiesAndPreRoundedBackwardAreBitIdentical) {
  struct Shape {
    int64_t M, K, N;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{37, 29, 61}, Shape{256, 256, 768}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N);
    const auto in = random_vector(s.M * s.K, 1);
    const auto weight = random_vector(s.N * s.K, 2);
    const auto bias = random_vector(s.N, 3);
    const auto d_out = random_vector(s.M * s.N, 4);
    MatmulEngine engine;
    // Forward: plain, and keeping the bf16 copies.
    std::vector<float> out(static_cast<size_t>(s.M * s.N)), out_kept(out.size());
    engine.forward(out.data(), in.data(), weight.data(), bias.data(), s.M, s.K, s.N,
                   Precision::bf16);
    std::vector<lattice::bf16> in16(in.size()), weight16(weight.size());
    engine.forward(out_kept.data(), in.data(), weight.data(), bias.data(), s.M, s.K, s.N,
                   Precision::bf16, {in16.data(), weight16.data()});
    EXPECT_EQ(out, out_kept);
    EXPECT_EQ(bits_of(in16), bf16_bits_of(in));
    EXPECT_EQ(bits_of(weight16), bf16_bits_of(weight));
    // Backward: plain, with the kept copies (fp32 in/weight not given), and with d_out pre-rounded.
    std::vector<lattice::bf16> d_out16(d_out.size());
    for (size_t i = 0; i < d_out.size(); ++i) d_out16[i] = lattice::to_bf16(d_out[i]);
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> d_in(in.size()), d_w(weight.size(), 0.25f), d_b(bias.size(), 0.5f);
      std::vector<float> ref_in(in.size()), ref_w(weight.size(), 0.25f), ref_b(bias.size(), 0.5f);
      engine.backward(ref_in.data(), ref_w.data(), ref_b.data(), d_out.data(), in.data(),
                      weight.data(), s.M, s.K, s.N, Precision::bf16);
      Bf16Operands rounded;
      if (variant != 1) rounded.in = in16.data(), rounded.weight = weight16.data();
      if (variant != 0) rounded.d_out = d_out16.data();
      engine.backward(d_in.data(), d_w.data(), d_b.data(), d_out.data(),
                      variant != 1 ? nullptr : in.data(), variant != 1 ? nullptr : weight.data(),
                      s.M, s.K, s.N, Precision::bf16, rounded);
      EXPECT_EQ(d_in, ref_in) << "variant " << variant;
      EXPECT_EQ(d_w, ref_w) << "variant " << variant;
      EXPECT_EQ(d_b, ref_b) << "variant " << variant;
    }
    // Without a bias, d_out itself is not needed once it is rounded.
    std::vector<float> d_w(weight.size(), 0.0f), ref_w(weight.size(), 0.0f);
    engine.backward(nullptr, ref_w.data(), nullptr, d_out.data(), in.data(), weight.data(), s.M,
                    s.K, s.N, Precision::bf16);
    engine.backward(nullptr, d_w.data(), nullptr, nullptr, nullptr, nullptr, s.M, s.K, s.N,
                    Precision::bf16, {in16.data(), weight16.data(), d_out16.data()});
    EXPECT_EQ(d_w, ref_w);
  }
}

}  // namespace
}  // namespace lattice::kernels
