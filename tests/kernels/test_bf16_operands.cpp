// Tests of the bf16 operands that kernels hand each other instead of rounding fp32 values again:
// the cross-entropy's bf16 logits gradient, the Linear forward's kept bf16 input and given bf16
// weight, and a backward fed with pre-rounded operands. Each must equal, bit for bit, the path that
// rounds fp32 values (lattice::to_bf16 of the fp32 results) -- the reference is the existing
// fp32-output kernel. The one-pass forward and backward (forward_backward_in_row_chunks) is checked
// against forward() then backward() the same way, its weight gradient within the bound of its sum
// order.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/layernorm.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"
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

TEST(CrossEntropyBf16, RowChunksEqualTheWholeBatch) {
  const int64_t rows = 9, V = 1000;
  const auto logits = random_vector(rows * V, 12, 8.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[static_cast<size_t>(r)] = static_cast<int32_t>(r * 97);
  targets[4] = -1;  // ignored row
  std::vector<lattice::bf16> whole(logits.size());
  const double whole_loss = cross_entropy_forward_backward_bf16(whole.data(), logits.data(),
                                                                targets.data(), rows, V, 0.25f);
  const double forward_loss = cross_entropy_forward(logits.data(), targets.data(), rows, V);
  // Chunks of 4, 4 and 1 rows, the way a chunked head hands them over.
  std::vector<lattice::bf16> chunked(logits.size(), lattice::bf16{0xffff});
  std::vector<double> row_losses(static_cast<size_t>(rows), -1.0), forward_rows = row_losses;
  std::vector<float> work(static_cast<size_t>(V));
  for (int64_t begin = 0; begin < rows; begin += 4) {
    const int64_t n = std::min<int64_t>(4, rows - begin);
    cross_entropy_rows_bf16(chunked.data() + begin * V, row_losses.data() + begin,
                            logits.data() + begin * V, targets.data() + begin, n, V, 0.25f,
                            work.data(), V);
    cross_entropy_rows_bf16(nullptr, forward_rows.data() + begin, logits.data() + begin * V,
                            targets.data() + begin, n, V, 0.0f, work.data(), V);
  }
  double chunked_loss = 0.0, chunked_forward_loss = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    chunked_loss += row_losses[static_cast<size_t>(r)];
    chunked_forward_loss += forward_rows[static_cast<size_t>(r)];
  }
  EXPECT_EQ(row_losses[4], 0.0);
  EXPECT_EQ(chunked_loss, whole_loss);
  EXPECT_EQ(chunked_forward_loss, forward_loss);
  EXPECT_EQ(bits_of(chunked), bits_of(whole));
}

// The product of multiply_in_row_chunks, gathered from its chunks; checks every row comes once.
std::vector<float> gathered_chunks(MatmulEngine& engine, const std::vector<lattice::bf16>& in16,
                                   const std::vector<float>& weight, bool transposed, int64_t M,
                                   int64_t K, int64_t N, int64_t chunk_rows) {
  std::vector<float> out(static_cast<size_t>(M * N), std::nanf(""));
  std::vector<int> seen(static_cast<size_t>(M), 0);
  engine.multiply_in_row_chunks(in16.data(), weight.data(), transposed, M, K, N, chunk_rows,
                                [&](int64_t begin, int64_t rows, const float* chunk) {
                                  for (int64_t r = 0; r < rows; ++r) {
                                    ++seen[static_cast<size_t>(begin + r)];
                                    std::memcpy(out.data() + (begin + r) * N, chunk + r * N,
                                                sizeof(float) * static_cast<size_t>(N));
                                  }
                                });
  EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(M), 1));
  return out;
}

// The engines of both ways to run bf16 products off Lattice's AMX kernels (matmul.hpp) that this
// CPU runs: oneDNN 2.6 builds no bf16 GEMM without AVX-512, so on an AVX2-only host (AMD Zen 3),
// or under ONEDNN_MAX_CPU_ISA=AVX2, only the widened fp32 one (see test_matmul.cpp's MatmulBf16
// for the reproduction on an AMX host).
std::vector<Bf16FallbackGemm> runnable_fallbacks() {
  std::vector<Bf16FallbackGemm> fallbacks;
  if (MatmulEngine::onednn_bf16_available()) fallbacks.push_back(Bf16FallbackGemm::onednn_bf16);
  fallbacks.push_back(Bf16FallbackGemm::widened_fp32);
  return fallbacks;
}
const std::vector<Bf16FallbackGemm> kFallbacks = runnable_fallbacks();

// Whether an engine's row-chunk products equal its whole products bit for bit: on oneDNN's bf16
// GEMMs, which sweep K in order as Lattice's AMX kernels do where both run on AMX. Not on widened
// operands (sgemm's kernels differ with the row count), nor on emulated tiles (the build of
// LATTICE_AMX_EMULATED, where oneDNN runs without AMX beside the emulated AMX kernels).
bool chunks_bit_identical(Bf16FallbackGemm fallback) {
#if defined(LATTICE_AMX_EMULATED)
  (void)fallback;
  return false;
#else
  return fallback == Bf16FallbackGemm::onednn_bf16;
#endif
}

// Whether `got` equals `expected`, both C[M, N] = A[M, K] · op(B) (+ bias) from the same bf16
// operands: bit for bit where `bit_identical`, else each element within the rounding of two K-term
// fp32 sums of the same exact products (in different orders, and the bias added once):
// |got - expected| <= 2 (K + 1) · 2^-24 · (sum_k |a_ik b_kj| + |bias_j|) (Higham's bound for
// recursive summation). B is [N, K] when b_nk, else [K, N]; `a` and `b` hold the bf16 values.
void expect_same_product(const std::vector<float>& got, const std::vector<float>& expected,
                         bool bit_identical, const std::vector<float>& a,
                         const std::vector<float>& b, bool b_nk, int64_t M, int64_t K, int64_t N,
                         const float* bias = nullptr) {
  ASSERT_EQ(got.size(), expected.size());
  if (bit_identical) {
    EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), sizeof(float) * got.size()));
    return;
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double magnitude = bias != nullptr ? std::fabs(static_cast<double>(bias[n])) : 0.0;
      for (int64_t k = 0; k < K; ++k)
        magnitude +=
            std::fabs(static_cast<double>(a[m * K + k]) * (b_nk ? b[n * K + k] : b[k * N + n]));
      const size_t i = static_cast<size_t>(m * N + n);
      ASSERT_LE(std::fabs(static_cast<double>(got[i]) - expected[i]),
                2.0 * static_cast<double>(K + 1) * std::ldexp(1.0, -24) * magnitude + 1e-30)
          << "element [" << m << ", " << n << "]";
    }
  }
}

std::vector<float> widened(const std::vector<lattice::bf16>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = lattice::to_float(values[i]);
  return out;
}

std::vector<float> bf16_rounded(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    out[i] = lattice::to_float(lattice::to_bf16(values[i]));
  return out;
}

TEST(MatmulBf16RowChunks, AutomaticWidensExactlyWhereOneDnnHasNoAmx) {
  // The environment variable chooses when set; else the CPU (oneDNN's effective ISA).
  MatmulEngine engine;
  const char* chosen = std::getenv("LATTICE_MATMUL_BF16_FALLBACK");
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  const Bf16FallbackGemm expected =
      chosen != nullptr && *chosen != '\0'
          ? (std::string(chosen) == "fp32" ? Bf16FallbackGemm::widened_fp32
                                           : Bf16FallbackGemm::onednn_bf16)
          : ((isa & amx) == amx ? Bf16FallbackGemm::onednn_bf16 : Bf16FallbackGemm::widened_fp32);
  EXPECT_EQ(engine.bf16_fallback(), expected);
  EXPECT_EQ(MatmulEngine(Bf16FallbackGemm::widened_fp32).bf16_fallback(),
            Bf16FallbackGemm::widened_fp32);
  if (MatmulEngine::onednn_bf16_available()) {
    EXPECT_EQ(MatmulEngine(Bf16FallbackGemm::onednn_bf16).bf16_fallback(),
              Bf16FallbackGemm::onednn_bf16);
  } else {
    // Where oneDNN builds no bf16 GEMM, automatic widens and asking for oneDNN's is refused.
    EXPECT_EQ(engine.bf16_fallback(), Bf16FallbackGemm::widened_fp32);
    EXPECT_THROW(MatmulEngine{Bf16FallbackGemm::onednn_bf16}, Error);
  }
}

TEST(MatmulBf16RowChunks, ChunksEqualTheWholeForwardAndInputGradientAndEveryRowComesOnce) {
  struct Shape {
    int64_t M, K, N, chunk;
  };
  // Chunks dividing M, a short tail, a single chunk larger than M, odd sizes.
  for (const Shape s : {Shape{64, 32, 96, 16}, Shape{70, 48, 130, 32}, Shape{5, 16, 40, 64},
                        Shape{64, 32, 72, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << s.M << " K=" << s.K << " N=" << s.N << " chunk=" << s.chunk);
    const auto in = random_vector(s.M * s.K, 21, 1.0f);
    const auto weight = random_vector(s.N * s.K, 22, 0.5f);  // a Linear's [N out, K in]
    std::vector<lattice::bf16> in16(in.size());
    for (size_t i = 0; i < in.size(); ++i) in16[i] = lattice::to_bf16(in[i]);
    // As a Linear's input gradient: d_in[M,N'] = d_out[M,K'] · W[K',N'] with the weight read as
    // [K'=N out, N'=K in] -- here `in` plays d_out, so use a weight of [K out, N in].
    const auto weight_kn = random_vector(s.K * s.N, 23, 0.5f);
    for (const Bf16FallbackGemm fallback : kFallbacks) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, widened "
                                          << (fallback == Bf16FallbackGemm::widened_fp32));
        lattice::testing::ScopedOmpThreads scope(threads);
        MatmulEngine engine(fallback);
        // Same operands, same K order: on oneDNN's bf16 GEMMs (and Lattice's AMX kernels) the
        // chunked product is bit-identical to the whole one; on widened operands sgemm's kernels
        // differ with the row count and the two agree to fp32 rounding.
        const bool bit_identical = chunks_bit_identical(fallback);
        std::vector<float> whole(static_cast<size_t>(s.M * s.N));
        engine.forward(whole.data(), in.data(), weight.data(), nullptr, s.M, s.K, s.N,
                       Precision::bf16);
        const auto chunked = gathered_chunks(engine, in16, weight, true, s.M, s.K, s.N, s.chunk);
        expect_same_product(chunked, whole, bit_identical, widened(in16), bf16_rounded(weight),
                            true, s.M, s.K, s.N);
        // backward's d_in = d_out[M, K] · weight[K, N] for a Linear with K outputs and N inputs.
        std::vector<float> d_in(static_cast<size_t>(s.M * s.N));
        engine.backward(d_in.data(), nullptr, nullptr, in.data(), nullptr, weight_kn.data(), s.M,
                        s.N, s.K, Precision::bf16);
        const auto chunked_d_in =
            gathered_chunks(engine, in16, weight_kn, false, s.M, s.K, s.N, s.chunk);
        expect_same_product(chunked_d_in, d_in, bit_identical, widened(in16),
                            bf16_rounded(weight_kn), false, s.M, s.K, s.N);
      }
    }
  }
}

TEST(MatmulBf16RowChunks, TheBiasIsAddedAsTheWholeForwardAddsItAndADestinationKeepsTheRows) {
  const int64_t M = 40, K = 24, N = 80, chunk = 16;
  const auto in = random_vector(M * K, 25, 1.0f);
  const auto weight = random_vector(N * K, 26, 0.5f);
  const auto bias = random_vector(N, 27, 2.0f);
  std::vector<lattice::bf16> in16(in.size());
  for (size_t i = 0; i < in.size(); ++i) in16[i] = lattice::to_bf16(in[i]);
  for (const Bf16FallbackGemm fallback : kFallbacks) {
    SCOPED_TRACE(::testing::Message()
                 << "widened " << (fallback == Bf16FallbackGemm::widened_fp32));
    MatmulEngine engine(fallback);
    const bool bit_identical = chunks_bit_identical(fallback);
    std::vector<float> whole(static_cast<size_t>(M * N));
    engine.forward(whole.data(), in.data(), weight.data(), bias.data(), M, K, N, Precision::bf16);
    std::vector<float> chunked(whole.size(), std::nanf(""));
    engine.multiply_in_row_chunks(
        in16.data(), weight.data(), true, M, K, N, chunk,
        [&](int64_t begin, int64_t rows, const float* out) {
          std::memcpy(chunked.data() + begin * N, out,
                      sizeof(float) * static_cast<size_t>(rows * N));
        },
        bias.data());
    expect_same_product(chunked, whole, bit_identical, widened(in16), bf16_rounded(weight), true, M,
                        K, N, bias.data());
    // With a destination the chunks land in its rows and consume sees them there.
    std::vector<float> kept(whole.size(), std::nanf(""));
    std::atomic<int64_t> handed_in_place{0};  // consume runs on every thread of the region
    engine.multiply_in_row_chunks(
        in16.data(), weight.data(), true, M, K, N, chunk,
        [&](int64_t begin, int64_t rows, const float* out) {
          if (out == kept.data() + begin * N) handed_in_place += rows;
        },
        bias.data(), kept.data());
    EXPECT_EQ(handed_in_place, M);
    EXPECT_EQ(0, std::memcmp(kept.data(), chunked.data(), sizeof(float) * whole.size()));
  }
}

// forward_backward_in_row_chunks against forward() then backward() on the same operands. The
// weight gradient is the same fp32 sum of exact bf16 products in another order (per chunk, then
// per lane), so each element may differ by the rounding of two M-term fp32 sums: at most
// 2 (M - 1) · 2^-24 · sum |terms| (Higham's bound for recursive summation). The logits handed to
// the consumer and d_in come from the same operands in the same K order and are bit-identical on
// shapes like the models' (inputs and outputs at least 40 wide); for a d_in narrower than that
// (d_model 16-32), oneDNN picks another kernel for the whole product than for a chunk, and d_in
// then meets the same summation bound instead (the existing multiply_in_row_chunks does the same).
TEST(MatmulBf16RowChunks, ForwardAndBackwardInOnePassEqualForwardThenBackward) {
  struct Shape {
    int64_t M, K, N, chunk;
    bool d_in_bit_identical;
  };
  for (const Shape s :
       {Shape{64, 64, 96, 16, true}, Shape{70, 48, 130, 32, true}, Shape{300, 64, 200, 64, true},
        Shape{5, 40, 40, 64, true}, Shape{100, 24, 72, 8, false}}) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << s.M << " K=" << s.K << " N=" << s.N << " chunk=" << s.chunk);
    const auto in = random_vector(s.M * s.K, 31, 1.0f);
    const auto weight = random_vector(s.N * s.K, 32, 0.5f);  // [N out, K in]
    std::vector<lattice::bf16> in16(in.size()), d_out16(static_cast<size_t>(s.M * s.N));
    for (size_t i = 0; i < in.size(); ++i) in16[i] = lattice::to_bf16(in[i]);
    const auto d_out = random_vector(s.M * s.N, 33, 1.0f);
    for (size_t i = 0; i < d_out.size(); ++i) d_out16[i] = lattice::to_bf16(d_out[i]);
    for (const Bf16FallbackGemm fallback : kFallbacks)
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, widened "
                                          << (fallback == Bf16FallbackGemm::widened_fp32));
        lattice::testing::ScopedOmpThreads scope(threads);
        MatmulEngine engine(fallback);
        // On widened operands nothing is bit-identical: sgemm's kernels differ with the row count.
        const bool bit_identical = chunks_bit_identical(fallback);
        std::vector<float> logits(static_cast<size_t>(s.M * s.N));
        engine.forward(logits.data(), in.data(), weight.data(), nullptr, s.M, s.K, s.N,
                       Precision::bf16);
        std::vector<float> d_in(static_cast<size_t>(s.M * s.K));
        std::vector<float> d_weight(static_cast<size_t>(s.N * s.K), 0.0f);
        Bf16Operands rounded;
        rounded.d_out = d_out16.data();
        rounded.in = in16.data();
        engine.backward(d_in.data(), d_weight.data(), nullptr, nullptr, nullptr, weight.data(), s.M,
                        s.K, s.N, Precision::bf16, rounded);

        const int lanes = MatmulEngine::gradient_lanes(s.M, s.chunk);
        const int64_t chunks = (s.M + std::min(s.chunk, s.M) - 1) / std::min(s.chunk, s.M);
        EXPECT_EQ(lanes, std::min<int64_t>(threads, chunks));
        std::vector<float> seen_logits(logits.size(), std::nanf(""));
        std::vector<int> seen(static_cast<size_t>(s.M), 0);
        std::vector<float> fused_d_in(d_in.size(), std::nanf(""));
        std::vector<float> partials(static_cast<size_t>(lanes * s.N * s.K), std::nanf(""));
        engine.forward_backward_in_row_chunks(
            in16.data(), weight.data(), s.M, s.K, s.N, s.chunk,
            [&](int64_t begin, int64_t rows, const float* out, lattice::bf16* d_chunk16,
                int64_t stride) {
              ASSERT_GE(stride, s.N);
              for (int64_t r = 0; r < rows; ++r) {
                ++seen[static_cast<size_t>(begin + r)];
                std::memcpy(seen_logits.data() + (begin + r) * s.N, out + r * stride,
                            sizeof(float) * static_cast<size_t>(s.N));
                std::memcpy(d_chunk16 + r * stride, d_out16.data() + (begin + r) * s.N,
                            sizeof(lattice::bf16) * static_cast<size_t>(s.N));
                // What a consumer leaves past column N must not matter.
                std::fill(d_chunk16 + r * stride + s.N, d_chunk16 + (r + 1) * stride,
                          lattice::to_bf16(std::nanf("")));
              }
            },
            fused_d_in.data(), partials.data(), lanes);
        EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(s.M), 1));
        expect_same_product(seen_logits, logits, bit_identical, widened(in16), bf16_rounded(weight),
                            true, s.M, s.K, s.N);
        if (s.d_in_bit_identical && bit_identical) {
          EXPECT_EQ(0, std::memcmp(fused_d_in.data(), d_in.data(), sizeof(float) * d_in.size()));
        } else {
          for (int64_t m = 0; m < s.M; ++m) {
            for (int64_t k = 0; k < s.K; ++k) {
              double magnitude = 0.0;
              for (int64_t n = 0; n < s.N; ++n)
                magnitude +=
                    std::fabs(static_cast<double>(lattice::to_float(d_out16[m * s.N + n])) *
                              lattice::to_float(lattice::to_bf16(weight[n * s.K + k])));
              const size_t i = static_cast<size_t>(m * s.K + k);
              ASSERT_LE(std::fabs(static_cast<double>(fused_d_in[i]) - d_in[i]),
                        2.0 * static_cast<double>(s.N) * std::ldexp(1.0, -24) * magnitude + 1e-30)
                  << "d_in[" << m << ", " << k << "]";
            }
          }
        }
        std::vector<float> fused_d_weight(d_weight.size(), 0.0f);
        add_chunk_partials(fused_d_weight.data(), partials.data(), lanes, s.N * s.K, s.N * s.K);
        for (int64_t n = 0; n < s.N; ++n) {
          for (int64_t k = 0; k < s.K; ++k) {
            double magnitude = 0.0;
            for (int64_t m = 0; m < s.M; ++m)
              magnitude += std::fabs(static_cast<double>(lattice::to_float(d_out16[m * s.N + n])) *
                                     lattice::to_float(in16[m * s.K + k]));
            const size_t i = static_cast<size_t>(n * s.K + k);
            ASSERT_LE(std::fabs(static_cast<double>(fused_d_weight[i]) - d_weight[i]),
                      2.0 * static_cast<double>(s.M) * std::ldexp(1.0, -24) * magnitude + 1e-30)
                << "d_weight[" << n << ", " << k << "]";
          }
        }
        // Lanes other than gradient_lanes() are refused: the partials buffer is sized for them.
        EXPECT_THROW(engine.forward_backward_in_row_chunks(
                         in16.data(), weight.data(), s.M, s.K, s.N, s.chunk,
                         [](int64_t, int64_t, const float*, lattice::bf16*, int64_t) {},
                         fused_d_in.data(), partials.data(), lanes + 1),
                     Error);
      }
  }
}

TEST(MatmulBf16RowChunks, AnExceptionInAForwardBackwardChunkReachesTheCaller) {
  const int64_t M = 64, K = 16, N = 32, chunk = 16;
  const auto in = random_vector(M * K, 34, 1.0f);
  const auto weight = random_vector(N * K, 35, 1.0f);
  std::vector<lattice::bf16> in16(in.size());
  for (size_t i = 0; i < in.size(); ++i) in16[i] = lattice::to_bf16(in[i]);
  MatmulEngine engine;
  const int lanes = MatmulEngine::gradient_lanes(M, chunk);
  std::vector<float> d_in(static_cast<size_t>(M * K));
  std::vector<float> partials(static_cast<size_t>(lanes * N * K));
  EXPECT_THROW(engine.forward_backward_in_row_chunks(
                   in16.data(), weight.data(), M, K, N, chunk,
                   [](int64_t begin, int64_t, const float*, lattice::bf16*, int64_t) {
                     if (begin == 32) throw Error("chunk failed");
                   },
                   d_in.data(), partials.data(), lanes),
               Error);
}

TEST(MatmulBf16RowChunks, AnExceptionInAChunkReachesTheCaller) {
  const int64_t M = 64, K = 16, N = 32;
  const auto in = random_vector(M * K, 23, 1.0f);
  const auto weight = random_vector(N * K, 24, 1.0f);
  std::vector<lattice::bf16> in16(in.size());
  for (size_t i = 0; i < in.size(); ++i) in16[i] = lattice::to_bf16(in[i]);
  MatmulEngine engine;
  EXPECT_THROW(engine.multiply_in_row_chunks(in16.data(), weight.data(), true, M, K, N, 16,
                                             [](int64_t begin, int64_t, const float*) {
                                               if (begin == 32) throw Error("chunk failed");
                                             }),
               Error);
}

TEST(LayerNormBf16, ForwardIsTheRoundedFp32ForwardWithTheSameStatistics) {
  for (const int64_t C : {int64_t{1}, int64_t{17}, int64_t{256}, int64_t{1000}}) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const int64_t rows = 37;
    const auto in = random_vector(rows * C, 31, 3.0f);
    const auto weight = random_vector(C, 32, 1.0f);
    const auto bias = random_vector(C, 33, 0.5f);
    for (int threads : {1, 2}) {
      lattice::testing::ScopedOmpThreads scope(threads);
      std::vector<float> out(in.size()), mean(rows), rstd(rows), mean16(rows), rstd16(rows);
      layernorm_forward(out.data(), mean.data(), rstd.data(), in.data(), weight.data(), bias.data(),
                        rows, C, 1e-5f);
      std::vector<lattice::bf16> out16(in.size());
      layernorm_forward_bf16(out16.data(), mean16.data(), rstd16.data(), in.data(), weight.data(),
                             bias.data(), rows, C, 1e-5f);
      EXPECT_EQ(bits_of(out16), bf16_bits_of(out)) << threads << " threads";
      EXPECT_EQ(mean16, mean);
      EXPECT_EQ(rstd16, rstd);
    }
  }
}

TEST(GeluBf16, ForwardWithSlopeKeepsTheRoundedFp32SlopeAndTheSameOutput) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{70001}}) {
    auto x = random_vector(n, 19, 12.0f);
    if (n > 3) x[0] = -88.0f, x[1] = 0.0f, x[2] = 1e-39f;
    std::vector<float> value(static_cast<size_t>(n)), slope(static_cast<size_t>(n));
    gelu_forward(value.data(), x.data(), n);
    const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    gelu_backward(slope.data(), ones.data(), x.data(), n);  // the slope: d_in for d_out = 1
    for (int threads : {1, 2}) {
      lattice::testing::ScopedOmpThreads scope(threads);
      std::vector<lattice::bf16> out(static_cast<size_t>(n)), slope16(static_cast<size_t>(n));
      gelu_forward_bf16_with_slope(out.data(), slope16.data(), x.data(), n);
      EXPECT_EQ(bits_of(out), bf16_bits_of(value)) << "n=" << n << ", " << threads << " threads";
      EXPECT_EQ(bits_of(slope16), bf16_bits_of(slope))
          << "n=" << n << ", " << threads << " threads";
    }
  }
}

TEST(GeluBf16, BackwardFromTheSlopeIsTheRoundedProductAndNearTheFp32Backward) {
  for (const int64_t cols : {int64_t{1}, int64_t{37}, int64_t{1024}, int64_t{1500}}) {
    SCOPED_TRACE(::testing::Message() << "cols=" << cols);
    const int64_t rows = 9;
    const auto in = random_vector(rows * cols, 51, 4.0f);
    const auto d_out = random_vector(rows * cols, 52, 1.0f);
    std::vector<lattice::bf16> gelu16(in.size()), slope16(in.size());
    gelu_forward_bf16_with_slope(gelu16.data(), slope16.data(), in.data(), rows * cols);
    std::vector<lattice::bf16> d_in16(in.size());
    std::vector<double> sums(static_cast<size_t>(cols), 0.5);  // accumulated into
    gelu_backward_from_slope_bf16_rows(d_in16.data(), sums.data(), d_out.data(), slope16.data(),
                                       rows, cols);
    std::vector<float> exact(in.size());
    gelu_backward(exact.data(), d_out.data(), in.data(), rows * cols);
    double max_exact = 0.0;
    for (float v : exact) max_exact = std::max(max_exact, std::fabs(static_cast<double>(v)));
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0.5;
      for (int64_t i = 0; i < rows; ++i) {
        const size_t e = static_cast<size_t>(i * cols + j);
        const float product = d_out[e] * lattice::to_float(slope16[e]);
        want += static_cast<double>(product);
        EXPECT_EQ(d_in16[e].bits, lattice::to_bf16(product).bits) << "element " << e;
        // Two bf16 roundings (the slope's and the result's), each within 2^-9 relative: the
        // result stays within 2^-7 of the largest fp32 gradient of the exact backward.
        EXPECT_NEAR(lattice::to_float(d_in16[e]), exact[e], max_exact * 0x1p-7) << "element " << e;
      }
      EXPECT_EQ(sums[static_cast<size_t>(j)], want) << "column " << j;
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
    // Forward: plain, and keeping the bf16 input with the weight given rounded (the parameter
    // store's copy; the fp32 weight then not read).
    std::vector<float> out(static_cast<size_t>(s.M * s.N)), out_kept(out.size());
    engine.forward(out.data(), in.data(), weight.data(), bias.data(), s.M, s.K, s.N,
                   Precision::bf16);
    std::vector<lattice::bf16> in16(in.size()), weight16(weight.size());
    for (size_t i = 0; i < weight.size(); ++i) weight16[i] = lattice::to_bf16(weight[i]);
    engine.forward(out_kept.data(), in.data(), nullptr, bias.data(), s.M, s.K, s.N, Precision::bf16,
                   {in16.data(), weight16.data()});
    EXPECT_EQ(out, out_kept);
    EXPECT_EQ(bits_of(in16), bf16_bits_of(in));
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
