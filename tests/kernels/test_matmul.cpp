// Tests of MatmulEngine (oneDNN Linear forward/backward and general GEMM) against naive
// double-precision references and finite differences, in fp32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::max_relative_error;
using lattice::testing::numerical_gradient;
using lattice::testing::random_vector;
using lattice::testing::weighted_sum;

std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_to_bf16(x);
  return v;
}

// out[M,N] = in[M,K] · weight[N,K]^T + bias, in double.
std::vector<double> linear_reference(const std::vector<float>& in, const std::vector<float>& weight,
                                     const float* bias, int64_t M, int64_t K, int64_t N) {
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = bias != nullptr ? bias[j] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(in[i * K + k]) * weight[j * K + k];
      out[static_cast<size_t>(i * N + j)] = s;
    }
  return out;
}

struct LinearGradients {
  std::vector<double> d_in, d_weight, d_bias;
};

LinearGradients linear_backward_reference(const std::vector<float>& d_out,
                                          const std::vector<float>& in,
                                          const std::vector<float>& weight, int64_t M, int64_t K,
                                          int64_t N) {
  LinearGradients g{std::vector<double>(static_cast<size_t>(M * K)),
                    std::vector<double>(static_cast<size_t>(N * K)),
                    std::vector<double>(static_cast<size_t>(N))};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const double d = d_out[i * N + j];
      g.d_bias[j] += d;
      for (int64_t k = 0; k < K; ++k) {
        g.d_in[i * K + k] += d * weight[j * K + k];
        g.d_weight[j * K + k] += d * in[i * K + k];
      }
    }
  return g;
}

struct Shape {
  int64_t M, K, N;
};

// fp32 accumulation over K <= a few hundred terms of O(1) products: errors stay within a few fp32
// ulps of the result's scale, so 1e-5 relative to the largest reference value has an order of
// margin.
constexpr double kFp32Tolerance = 1e-5;
// bf16 inputs are exact in fp32 and so are their products; only the fp32 accumulation rounds, so
// the same bound holds against a double reference computed on the bf16-rounded inputs.
constexpr double kBf16OnRoundedTolerance = 1e-5;

TEST(Matmul, ForwardFp32MatchesDoubleReference) {
  MatmulEngine engine;
  // {1100, 24, 40}: two blocks of kForwardPrimitiveRows rows on oneDNN's matmul primitive, the
  // rest on sgemm; {1024, 16, 24}: blocks only; the others: sgemm only.
  static_assert(1100 > 2 * kForwardPrimitiveRows && 1100 < 3 * kForwardPrimitiveRows &&
                1024 % kForwardPrimitiveRows == 0);
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{33, 7, 64}, Shape{64, 96, 80},
                  Shape{130, 257, 70}, Shape{1100, 24, 40}, Shape{1024, 16, 24}}) {
    for (bool with_bias : {false, true}) {
      auto in = random_vector(s.M * s.K, 1);
      auto weight = random_vector(s.N * s.K, 2);
      auto bias = random_vector(s.N, 3);
      std::vector<float> out(static_cast<size_t>(s.M * s.N), std::nanf(""));
      const float* b = with_bias ? bias.data() : nullptr;
      engine.forward(out.data(), in.data(), weight.data(), b, s.M, s.K, s.N, Precision::fp32);
      auto ref = linear_reference(in, weight, b, s.M, s.K, s.N);
      EXPECT_LT(max_relative_error(out, ref), kFp32Tolerance)
          << "M=" << s.M << " K=" << s.K << " N=" << s.N << " bias=" << with_bias;
    }
  }
}

// Both ways to run the bf16 products off Lattice's AMX kernels: oneDNN's bf16 matmul, and the
// operands widened to fp32 for sgemm (the default where the CPU has no AMX).
constexpr Bf16FallbackGemm kBf16Fallbacks[] = {Bf16FallbackGemm::onednn_bf16,
                                               Bf16FallbackGemm::widened_fp32};

// oneDNN 2.6 builds no bf16 GEMM without AVX-512: on an AVX2-only host (AMD Zen 3), or here under
// ONEDNN_MAX_CPU_ISA=AVX2, the OneDnnBf16 cases skip (the widened ones, which such a host runs,
// still run). Reproduced on an AMX host with the portable build (x86-64-v3) and both ISA caps,
// oneDNN's and the kernels' own (LATTICE_MAX_CPU_ISA, core/cpu_features.hpp):
//   cmake --preset portable && cmake --build --preset portable --target test_kernels
//   export ONEDNN_MAX_CPU_ISA=AVX2 LATTICE_MAX_CPU_ISA=avx2 OMP_NUM_THREADS=3
//   build-portable/tests/test_kernels
class MatmulBf16 : public ::testing::TestWithParam<Bf16FallbackGemm> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16FallbackGemm::onednn_bf16 && !MatmulEngine::onednn_bf16_available())
      GTEST_SKIP() << "oneDNN builds no bf16 GEMM on this CPU (it needs AVX-512)";
  }
};

std::string fallback_name(const ::testing::TestParamInfo<Bf16FallbackGemm>& info) {
  return info.param == Bf16FallbackGemm::onednn_bf16 ? "OneDnnBf16" : "WidenedFp32";
}

INSTANTIATE_TEST_SUITE_P(Fallbacks, MatmulBf16, ::testing::ValuesIn(kBf16Fallbacks), fallback_name);

TEST_P(MatmulBf16, ForwardMatchesReferenceOnRoundedInputs) {
  MatmulEngine engine(GetParam());
  // The last shape runs on Lattice's AMX kernel where the CPU has AMX (K and N multiples of 32,
  // at least 256 rows: a chunk of 256 and a tail of 44).
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{33, 7, 64}, Shape{130, 257, 70},
                  Shape{300, 520, 200}, Shape{300, 512, 96}}) {
    auto in = random_vector(s.M * s.K, 4);
    auto weight = random_vector(s.N * s.K, 5);
    auto bias = random_vector(s.N, 6);
    std::vector<float> out(static_cast<size_t>(s.M * s.N));
    engine.forward(out.data(), in.data(), weight.data(), bias.data(), s.M, s.K, s.N,
                   Precision::bf16);
    auto ref =
        linear_reference(rounded_to_bf16(in), rounded_to_bf16(weight), bias.data(), s.M, s.K, s.N);
    EXPECT_LT(max_relative_error(out, ref), kBf16OnRoundedTolerance)
        << "M=" << s.M << " K=" << s.K << " N=" << s.N;
    if (s.K >= 7) {
      // The inputs really were rounded: against the unrounded reference the error is of bf16's
      // relative precision (2^-9 per input), far above the fp32 accumulation error.
      auto exact = linear_reference(in, weight, bias.data(), s.M, s.K, s.N);
      EXPECT_GT(max_relative_error(out, exact), 1e-4);
    }
  }
}

void check_backward_against_reference(Precision precision,
                                      Bf16FallbackGemm fallback = Bf16FallbackGemm::automatic) {
  MatmulEngine engine(fallback);
  // {290, 64, 320}'s input gradient runs on Lattice's AMX kernel where the CPU has AMX (as in
  // forward, with the reduction over N = 320: two K blocks of the kernel). {1100, 24, 40}'s fp32
  // weight gradient is summed in slices of kWeightGradientRows rows, the last one partial;
  // {40, 24, 4096}'s as its transpose (rows 16 KiB apart), 1024 weight rows at a time;
  // {8, 2560, 4096}'s likewise in blocks of 816 rows (its scratch capped), the last one partial.
  for (Shape s :
       {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{33, 7, 64}, Shape{130, 257, 70}, Shape{200, 96, 300},
        Shape{290, 64, 320}, Shape{1100, 24, 40}, Shape{40, 24, 4096}, Shape{8, 2560, 4096}}) {
    static_assert(1100 > 2 * kWeightGradientRows && 1100 % kWeightGradientRows != 0);
    EXPECT_EQ(transposed_weight_gradient(s.N), s.N == 4096);
    auto in = random_vector(s.M * s.K, 7);
    auto weight = random_vector(s.N * s.K, 8);
    auto d_out = random_vector(s.M * s.N, 9);
    std::vector<float> d_in(static_cast<size_t>(s.M * s.K), std::nanf(""));
    std::vector<float> d_weight(static_cast<size_t>(s.N * s.K), 0.0f);
    std::vector<float> d_bias(static_cast<size_t>(s.N), 0.0f);
    engine.backward(d_in.data(), d_weight.data(), d_bias.data(), d_out.data(), in.data(),
                    weight.data(), s.M, s.K, s.N, precision);
    const bool bf16 = precision == Precision::bf16;
    auto ref = bf16 ? linear_backward_reference(rounded_to_bf16(d_out), rounded_to_bf16(in),
                                                rounded_to_bf16(weight), s.M, s.K, s.N)
                    : linear_backward_reference(d_out, in, weight, s.M, s.K, s.N);
    // d_bias is always summed from the fp32 d_out, in double.
    auto bias_ref = linear_backward_reference(d_out, in, weight, s.M, s.K, s.N).d_bias;
    const double tolerance = bf16 ? kBf16OnRoundedTolerance : kFp32Tolerance;
    EXPECT_LT(max_relative_error(d_in, ref.d_in), tolerance) << "M=" << s.M << " K=" << s.K;
    EXPECT_LT(max_relative_error(d_weight, ref.d_weight), tolerance) << "N=" << s.N;
    // A column sum in double rounded once to fp32: within one fp32 rounding of the reference.
    EXPECT_LT(max_relative_error(d_bias, bias_ref), 1e-7);
  }
}

TEST(Matmul, TransposedWeightGradientBlocksKeepTheirScratchBounded) {
  EXPECT_EQ(transposed_gradient_rows(24), kTransposedGradientRows);
  EXPECT_EQ(transposed_gradient_rows(256), kTransposedGradientRows);
  EXPECT_EQ(transposed_gradient_rows(2560), 816);
  EXPECT_EQ(transposed_gradient_rows(int64_t{1} << 20), 16);
  for (int64_t K : {1, 24, 256, 2560, 4096, 100000})
    EXPECT_LE(weight_gradient_scratch_floats(4096, K),
              std::max(kTransposedGradientScratchFloats, 16 * K));
  EXPECT_EQ(weight_gradient_scratch_floats(4095, 256), 0);
}

TEST(Matmul, BackwardFp32MatchesDoubleReference) {
  check_backward_against_reference(Precision::fp32);
}
TEST_P(MatmulBf16, BackwardMatchesReferenceOnRoundedInputs) {
  check_backward_against_reference(Precision::bf16, GetParam());
}

// Gradients of loss = sum(w ⊙ forward(in, weight, bias)) by central differences of the fp32
// forward. bf16 is not finite-differenced: its forward is piecewise constant in the inputs
// (rounding), so it is checked against the reference above instead.
TEST(Matmul, BackwardMatchesFiniteDifferences) {
  MatmulEngine engine;
  const int64_t M = 5, K = 7, N = 6;
  auto in = random_vector(M * K, 10);
  auto weight = random_vector(N * K, 11);
  auto bias = random_vector(N, 12);
  auto loss_weights = random_vector(M * N, 13);
  std::vector<float> out(static_cast<size_t>(M * N));
  auto loss = [&] {
    engine.forward(out.data(), in.data(), weight.data(), bias.data(), M, K, N, Precision::fp32);
    return weighted_sum(out, loss_weights);
  };
  // The loss is linear in each input, so central differences are exact up to rounding of the fp32
  // outputs (~1e-7 relative) divided by the step: 1e-2 steps give errors near 1e-5; allow 1e-3.
  const float step = 1e-2f;
  auto num_in = numerical_gradient(loss, in.data(), M * K, step);
  auto num_weight = numerical_gradient(loss, weight.data(), N * K, step);
  auto num_bias = numerical_gradient(loss, bias.data(), N, step);
  std::vector<float> d_in(static_cast<size_t>(M * K)), d_weight(static_cast<size_t>(N * K), 0.0f),
      d_bias(static_cast<size_t>(N), 0.0f);
  engine.backward(d_in.data(), d_weight.data(), d_bias.data(), loss_weights.data(), in.data(),
                  weight.data(), M, K, N, Precision::fp32);
  EXPECT_LT(max_relative_error(d_in, num_in), 1e-3);
  EXPECT_LT(max_relative_error(d_weight, num_weight), 1e-3);
  EXPECT_LT(max_relative_error(d_bias, num_bias), 1e-3);
}

TEST(Matmul, BackwardAccumulatesWeightAndBiasGradientsAndOverwritesInputGradient) {
  MatmulEngine engine;
  const int64_t M = 33, K = 17, N = 9;
  auto in = random_vector(M * K, 14);
  auto weight = random_vector(N * K, 15);
  auto d_out = random_vector(M * N, 16);
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    std::vector<float> fresh_in(static_cast<size_t>(M * K)),
        fresh_w(static_cast<size_t>(N * K), 0.0f), fresh_b(static_cast<size_t>(N), 0.0f);
    engine.backward(fresh_in.data(), fresh_w.data(), fresh_b.data(), d_out.data(), in.data(),
                    weight.data(), M, K, N, precision);
    auto prior_w = random_vector(N * K, 17);
    auto prior_b = random_vector(N, 18);
    std::vector<float> d_in(static_cast<size_t>(M * K), std::nanf(""));  // must be overwritten
    std::vector<float> d_w = prior_w, d_b = prior_b;
    engine.backward(d_in.data(), d_w.data(), d_b.data(), d_out.data(), in.data(), weight.data(), M,
                    K, N, precision);
    EXPECT_EQ(d_in, fresh_in);  // same primitive, same inputs: bit-identical
    for (size_t i = 0; i < d_w.size(); ++i) {
      // oneDNN's sum post-op adds the prior value to the fp32 result: one fp32 addition apart.
      EXPECT_NEAR(d_w[i], prior_w[i] + fresh_w[i],
                  1e-6 * (std::fabs(prior_w[i]) + std::fabs(fresh_w[i])) + 1e-30);
    }
    for (size_t j = 0; j < d_b.size(); ++j) EXPECT_FLOAT_EQ(d_b[j], prior_b[j] + fresh_b[j]);
  }
}

TEST(Matmul, BackwardSkipsNullOutputs) {
  MatmulEngine engine;
  const int64_t M = 12, K = 10, N = 8;
  auto in = random_vector(M * K, 19);
  auto weight = random_vector(N * K, 20);
  auto d_out = random_vector(M * N, 21);
  auto ref = linear_backward_reference(d_out, in, weight, M, K, N);
  std::vector<float> d_in(static_cast<size_t>(M * K)), d_w(static_cast<size_t>(N * K), 0.0f),
      d_b(static_cast<size_t>(N), 0.0f);
  engine.backward(nullptr, d_w.data(), nullptr, d_out.data(), in.data(), weight.data(), M, K, N,
                  Precision::fp32);
  EXPECT_LT(max_relative_error(d_w, ref.d_weight), kFp32Tolerance);
  engine.backward(d_in.data(), nullptr, nullptr, d_out.data(), in.data(), weight.data(), M, K, N,
                  Precision::fp32);
  EXPECT_LT(max_relative_error(d_in, ref.d_in), kFp32Tolerance);
  engine.backward(nullptr, nullptr, d_b.data(), d_out.data(), in.data(), weight.data(), M, K, N,
                  Precision::bf16);
  EXPECT_LT(max_relative_error(d_b, ref.d_bias), 1e-7);
  // Nothing requested at all is a no-op; in and weight may then be null too.
  engine.backward(nullptr, nullptr, nullptr, d_out.data(), nullptr, nullptr, M, K, N,
                  Precision::bf16);
}

TEST(Matmul, ZeroSizesAreHandled) {
  MatmulEngine engine;
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    // K = 0: the product is empty, so out = bias (or zero) and the input gradient is empty.
    std::vector<float> bias = {1.5f, -2.0f, 3.0f};
    std::vector<float> out(6, std::nanf(""));
    engine.forward(out.data(), nullptr, nullptr, bias.data(), 2, 0, 3, precision);
    EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 3.0f, 1.5f, -2.0f, 3.0f}));
    engine.forward(out.data(), nullptr, nullptr, nullptr, 2, 0, 3, precision);
    EXPECT_EQ(out, std::vector<float>(6, 0.0f));
    // N = 0: d_in = d_out · weight is a sum of nothing, zero.
    std::vector<float> d_in(8, std::nanf(""));
    engine.backward(d_in.data(), nullptr, nullptr, nullptr, nullptr, nullptr, 2, 4, 0, precision);
    EXPECT_EQ(d_in, std::vector<float>(8, 0.0f));
    // M = 0: no rows, so the accumulated gradients stay as they were.
    std::vector<float> d_w = {1, 2, 3, 4, 5, 6}, d_b = {7, 8, 9};
    engine.backward(nullptr, d_w.data(), d_b.data(), nullptr, nullptr, nullptr, 0, 2, 3, precision);
    EXPECT_EQ(d_w, (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(d_b, (std::vector<float>{7, 8, 9}));
    engine.forward(nullptr, nullptr, nullptr, nullptr, 0, 4, 3, precision);
  }
  EXPECT_THROW(engine.forward(nullptr, nullptr, nullptr, nullptr, -1, 4, 3, Precision::fp32),
               Error);
}

// C = alpha · op(A) · op(B) + beta · C in double, on row-major storage with leading dimensions.
std::vector<double> gemm_reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                                   const std::vector<float>& A, int64_t lda,
                                   const std::vector<float>& B, int64_t ldb, double beta,
                                   const std::vector<float>& C, int64_t ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      const double prior = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];
      out[static_cast<size_t>(i * ldc + j)] = alpha * s + prior;
    }
  return out;
}

TEST_P(MatmulBf16, GemmAllTransposesWithScalingAndLeadingDimensions) {
  MatmulEngine engine(GetParam());
  const int64_t M = 13, N = 21, K = 35;
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const bool bf16 = precision == Precision::bf16;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] :
             {std::pair{1.0f, 0.0f}, std::pair{0.37f, 1.0f}, std::pair{-1.25f, 0.5f}}) {
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          auto A = random_vector((ta ? K : M) * lda, 22);
          auto B = random_vector((tb ? N : K) * ldb, 23);
          auto C = random_vector(M * ldc, 24);
          if (beta == 0.0f) {  // beta = 0 must not read C: fill the matrix part with NaN
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = std::nanf("");
          }
          auto ref = gemm_reference(ta, tb, M, N, K, alpha, bf16 ? rounded_to_bf16(A) : A, lda,
                                    bf16 ? rounded_to_bf16(B) : B, ldb, beta, C, ldc);
          auto out = C;
          engine.gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, out.data(), ldc,
                      precision);
          EXPECT_LT(max_relative_error(out, ref), kFp32Tolerance)
              << precision_name(precision) << " ta=" << ta << " tb=" << tb << " alpha=" << alpha
              << " beta=" << beta;
          for (int64_t i = 0; i < M; ++i)  // padding columns beyond N are untouched
            for (int64_t j = N; j < ldc; ++j) EXPECT_EQ(out[i * ldc + j], C[i * ldc + j]);
        }
      }
    }
  }
}

TEST(Matmul, GemmDegenerateSizes) {
  MatmulEngine engine;
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  engine.gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, C.data(), 3,
              Precision::fp32);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  engine.gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f, C.data(), 3,
              Precision::bf16);
  EXPECT_EQ(C, std::vector<float>(6, 0.0f));
  engine.gemm(true, true, 0, 3, 4, 1.0f, nullptr, 1, nullptr, 4, 0.0f, nullptr, 3, Precision::fp32);
  EXPECT_THROW(engine.gemm(false, false, 2, 3, 4, 1.0f, C.data(), 3, C.data(), 3, 0.0f, C.data(), 3,
                           Precision::fp32),
               Error);  // lda 3 < K 4
}

// In bf16 the bias gradient is summed in the same threaded pass that rounds d_out for the GEMMs:
// it must still be the double column sum of the fp32 d_out, bit-identical across thread counts and
// whichever other gradients are requested, and the GEMM results must not change with it. The GEMM
// results are the same bits across thread counts only where the engine's bf16 GEMMs claim it
// (oneDNN's bf16 matmul, whose brgemm splits no reduction here, and Lattice's AMX kernels): on
// widened operands (the automatic choice without AMX, e.g. on an AVX2-only AMD Zen 3) they run on
// oneDNN's threaded sgemm, which splits the reduction over the threads for so small an output
// ([333, 40] summed over 300 rows) differently with their count, as fp32 Linears do; there they
// are compared across the requested gradients at each thread count instead. Reproduced on an AMX
// host with OMP_NUM_THREADS=3 ONEDNN_MAX_CPU_ISA=AVX2 (see MatmulBf16 above).
TEST(Matmul, Bf16BiasGradientFromTheRoundingPassIsThreadCountIndependent) {
  const int64_t M = 300, K = 40, N = 333;  // M * N above the threading threshold; a partial block
  auto in = random_vector(M * K, 27);
  auto weight = random_vector(N * K, 28);
  auto d_out = random_vector(M * N, 29);
  const auto ref = linear_backward_reference(d_out, in, weight, M, K, N);
  std::vector<float> reference_d_in, reference_d_w, reference_d_b;
  for (int threads : {1, 2, 3}) {
    lattice::testing::ScopedOmpThreads scope(threads);
    for (int wanted = 0; wanted < 3; ++wanted) {  // d_in and d_weight, d_in only, d_weight only
      MatmulEngine engine;
      std::vector<float> d_in(static_cast<size_t>(M * K)), d_w(static_cast<size_t>(N * K), 0.0f),
          d_b(static_cast<size_t>(N), 0.5f);
      engine.backward(wanted != 2 ? d_in.data() : nullptr, wanted != 1 ? d_w.data() : nullptr,
                      d_b.data(), d_out.data(), in.data(), weight.data(), M, K, N, Precision::bf16);
      std::vector<float> expected_b(d_b.size());
      for (size_t j = 0; j < d_b.size(); ++j)
        expected_b[j] = 0.5f + static_cast<float>(ref.d_bias[j]);
      EXPECT_LT(max_relative_error(d_b, std::vector<double>(expected_b.begin(), expected_b.end())),
                1e-6);
      if (reference_d_b.empty()) reference_d_b = d_b;
      // The GEMMs' references: the first case's, or the first thread count's where the engine's
      // bf16 GEMMs do not depend on the thread count.
      const bool gemms_thread_count_independent =
          engine.bf16_fallback() == Bf16FallbackGemm::onednn_bf16;
      if (wanted == 0 && (reference_d_in.empty() || !gemms_thread_count_independent)) {
        reference_d_in = d_in;
        reference_d_w = d_w;
      }
      EXPECT_EQ(d_b, reference_d_b) << threads << " threads, case " << wanted;
      if (wanted != 2) {
        EXPECT_EQ(d_in, reference_d_in) << threads << " threads, case " << wanted;
      }
      if (wanted != 1) {
        EXPECT_EQ(d_w, reference_d_w) << threads << " threads, case " << wanted;
      }
    }
  }
}

// Sets an environment variable for a scope and restores it after.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    if (had_)
      setenv(name_, previous_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::string previous_;
  bool had_ = false;
};

TEST(MatmulOptions, TheEnvironmentSettingsParseToOptionsAndBadValuesAreRefused) {
  {
    const ScopedEnvironment fallback("LATTICE_MATMUL_BF16_FALLBACK", "fp32");
    const ScopedEnvironment no_amx("LATTICE_MATMUL_NO_AMX_PACKED", "1");
    const MatmulOptions options = MatmulOptions::from_environment();
    EXPECT_EQ(options.bf16_fallback, Bf16FallbackGemm::widened_fp32);
    EXPECT_FALSE(options.amx_kernels);
  }
  {
    const ScopedEnvironment fallback("LATTICE_MATMUL_BF16_FALLBACK", "onednn");
    const ScopedEnvironment no_amx("LATTICE_MATMUL_NO_AMX_PACKED", "0");
    const MatmulOptions options = MatmulOptions::from_environment();
    EXPECT_EQ(options.bf16_fallback, Bf16FallbackGemm::onednn_bf16);
    EXPECT_TRUE(options.amx_kernels);
  }
  {
    const ScopedEnvironment fallback("LATTICE_MATMUL_BF16_FALLBACK", "");
    const ScopedEnvironment no_amx("LATTICE_MATMUL_NO_AMX_PACKED", "");
    const MatmulOptions options = MatmulOptions::from_environment();
    EXPECT_EQ(options.bf16_fallback, Bf16FallbackGemm::automatic);
    EXPECT_TRUE(options.amx_kernels);
  }
  const ScopedEnvironment bogus("LATTICE_MATMUL_BF16_FALLBACK", "bogus");
  EXPECT_THROW(MatmulOptions::from_environment(), Error);
  // An engine given its options never reads the environment; the default one takes its settings.
  EXPECT_NO_THROW(MatmulEngine{MatmulOptions{}});
  EXPECT_THROW(MatmulEngine{}, Error);
}

TEST(MatmulOptions, WithoutTheAmxKernelsWidenedBf16RunsOnTheFp32Units) {
  MatmulOptions options;
  options.bf16_fallback = Bf16FallbackGemm::widened_fp32;
  options.amx_kernels = false;
  const MatmulEngine widened(options);
  EXPECT_TRUE(widened.bf16_on_fp32_units());
  EXPECT_NE(widened.bf16_gemms().find("fp32 units"), std::string::npos) << widened.bf16_gemms();
  options.amx_kernels = true;
  // With the AMX kernels on, only a CPU without AMX leaves every bf16 product on the fp32 units.
  EXPECT_EQ(MatmulEngine(options).bf16_on_fp32_units(), !amx_packed_gemm_enabled());
  // The vocabulary-blocked head follows the engine's option (d_model 192: a width it takes).
  EXPECT_FALSE(widened.uses_vocab_blocked_head(192));
  EXPECT_EQ(MatmulEngine(options).uses_vocab_blocked_head(192), amx_packed_gemm_enabled());
  EXPECT_FALSE(MatmulEngine(options).uses_vocab_blocked_head(200));  // not a multiple of 32
  // The same products either way, to fp32 rounding: a shape the AMX kernels take.
  const int64_t M = 256, K = 64, N = 96;
  const auto in = random_vector(M * K, 41), weight = random_vector(N * K, 42);
  std::vector<float> a(static_cast<size_t>(M * N)), b(a.size());
  MatmulEngine(options).forward(a.data(), in.data(), weight.data(), nullptr, M, K, N,
                                Precision::bf16);
  MatmulEngine(MatmulOptions{Bf16FallbackGemm::automatic, false})
      .forward(b.data(), in.data(), weight.data(), nullptr, M, K, N, Precision::bf16);
  const auto ref = linear_reference(rounded_to_bf16(in), rounded_to_bf16(weight), nullptr, M, K, N);
  EXPECT_LT(max_relative_error(a, ref), kBf16OnRoundedTolerance);
  EXPECT_LT(max_relative_error(b, ref), kBf16OnRoundedTolerance);
}

TEST(Matmul, RepeatedCallsReuseCachedPrimitivesWithIdenticalResults) {
  MatmulEngine engine;
  const int64_t M = 64, K = 48, N = 40;
  auto in = random_vector(M * K, 25);
  auto weight = random_vector(N * K, 26);
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    std::vector<float> first(static_cast<size_t>(M * N)), second(first.size()), other(8 * N);
    engine.forward(first.data(), in.data(), weight.data(), nullptr, M, K, N, precision);
    engine.forward(other.data(), in.data(), weight.data(), nullptr, 8, K, N, precision);
    engine.forward(second.data(), in.data(), weight.data(), nullptr, M, K, N, precision);
    EXPECT_EQ(first, second);
  }
  EXPECT_GT(engine.scratch_bytes(), 0);  // bf16 operand copies are held
}

}  // namespace
}  // namespace lattice::kernels
