// Tests for the CPU embedding kernels: forward against a double-precision reference with and
// without position embeddings and with pos_offset; backward against double sums, against finite
// differences, and bit for bit against one serial loop in token order (which also proves +=
// semantics) with repeated tokens; bit-identical results for 1, 2 and 3 OpenMP threads.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/embedding.hpp"
#include "omp_thread_count.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

struct Shape {
  int64_t B, T, C;
};

// Single token, odd T and C, C not a multiple of 16, GPT-2's width.
const Shape kShapes[] = {{1, 1, 1}, {1, 3, 7}, {3, 1, 33}, {3, 5, 33}, {2, 3, 768}};
constexpr int64_t kVocab = 5;  // small, so every batch repeats tokens

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(vocab));
  return tokens;
}

// d_wte and d_wpe as one serial loop over (b, t) in order, in fp32, starting from the given values.
void serial_embedding_backward(std::vector<float>& d_wte, std::vector<float>* d_wpe,
                               const std::vector<float>& d_out, const std::vector<int32_t>& tokens,
                               int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      for (int64_t c = 0; c < C; ++c) {
        d_wte[tokens[i] * C + c] += d_out[i * C + c];
        if (d_wpe != nullptr) (*d_wpe)[t * C + c] += d_out[i * C + c];
      }
    }
  }
}

TEST(Embedding, ForwardMatchesReferenceWithAndWithoutPositions) {
  for (const Shape& s : kShapes) {
    for (int64_t pos_offset : {int64_t{0}, int64_t{4}}) {
      for (bool with_positions : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos_offset=" << pos_offset
                     << " wpe=" << with_positions);
        const auto tokens = random_tokens(s.B * s.T, kVocab, 1);
        const auto wte = random_vector(kVocab * s.C, 2);
        const auto wpe = random_vector((pos_offset + s.T) * s.C, 3);
        std::vector<float> out(s.B * s.T * s.C);
        embedding_forward(out.data(), tokens.data(), wte.data(),
                          with_positions ? wpe.data() : nullptr, s.B, s.T, s.C, pos_offset);
        for (int64_t b = 0; b < s.B; ++b) {
          for (int64_t t = 0; t < s.T; ++t) {
            for (int64_t c = 0; c < s.C; ++c) {
              double expected = wte[tokens[b * s.T + t] * s.C + c];
              if (with_positions) expected += wpe[(pos_offset + t) * s.C + c];
              // One fp32 add is correctly rounded: exactly the double sum rounded to fp32.
              ASSERT_EQ(out[(b * s.T + t) * s.C + c], static_cast<float>(expected));
            }
          }
        }
      }
    }
  }
}

TEST(Embedding, BackwardMatchesDoubleSums) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const auto tokens = random_tokens(s.B * s.T, kVocab, 5);
    const auto d_out = random_vector(s.B * s.T * s.C, 6);
    std::vector<float> d_wte(kVocab * s.C, 0.0f), d_wpe(s.T * s.C, 0.0f);
    embedding_backward(d_wte.data(), d_wpe.data(), d_out.data(), tokens.data(), s.B, s.T, s.C);
    std::vector<double> expected_wte(kVocab * s.C, 0.0), expected_wpe(s.T * s.C, 0.0);
    for (int64_t i = 0; i < s.B * s.T; ++i) {
      for (int64_t c = 0; c < s.C; ++c) {
        expected_wte[tokens[i] * s.C + c] += d_out[i * s.C + c];
        expected_wpe[(i % s.T) * s.C + c] += d_out[i * s.C + c];
      }
    }
    // Sums of at most 15 N(0,1) terms in fp32: a few ulp of the scale (observed < 1e-7).
    EXPECT_LT(max_relative_error(d_wte, expected_wte), 1e-6);
    EXPECT_LT(max_relative_error(d_wpe, expected_wpe), 1e-6);
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferencesWithPosOffset) {
  // Loss = sum w * out through the fp32 forward. The map is linear, so central differences have no
  // truncation error; with step 0.1, rounding one output (~6e-8 * |y|) costs ~3e-7 * |y| / |grad|.
  // Tolerance 1e-5.
  testing::ScopedOmpThreads one_thread(1);
  const int64_t B = 3, T = 5, C = 7, pos_offset = 2;
  const auto tokens = random_tokens(B * T, kVocab, 7);
  auto wte = random_vector(kVocab * C, 8);
  auto wpe = random_vector((pos_offset + T) * C, 9);
  const auto w = random_vector(B * T * C, 10);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, pos_offset);
    return testing::weighted_sum(out, w);
  };
  const auto numerical_wte = testing::numerical_gradient(loss, wte.data(), kVocab * C, 0.1f);
  const auto numerical_wpe =
      testing::numerical_gradient(loss, wpe.data(), (pos_offset + T) * C, 0.1f);
  std::vector<float> d_wte(kVocab * C, 0.0f), d_wpe((pos_offset + T) * C, 0.0f);
  embedding_backward(d_wte.data(), d_wpe.data() + pos_offset * C, w.data(), tokens.data(), B, T, C);
  EXPECT_LT(max_relative_error(d_wte, numerical_wte), 1e-5);
  EXPECT_LT(max_relative_error(d_wpe, numerical_wpe), 1e-5);
  // Positions before pos_offset were never used: zero gradient in both.
  for (int64_t i = 0; i < pos_offset * C; ++i) {
    EXPECT_EQ(d_wpe[i], 0.0f);
    EXPECT_EQ(numerical_wpe[i], 0.0);
  }
}

TEST(Embedding, BackwardAccumulatesExactlyAsOneSerialLoop) {
  // Starting from nonzero gradients (+=), with many repeats of each token; d_wpe null and not null.
  const int64_t B = 3, T = 17, C = 33;
  const auto tokens = random_tokens(B * T, kVocab, 11);
  const auto d_out = random_vector(B * T * C, 12);
  for (bool with_positions : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "wpe=" << with_positions);
    std::vector<float> d_wte = random_vector(kVocab * C, 13), d_wpe = random_vector(T * C, 14);
    std::vector<float> expected_wte = d_wte, expected_wpe = d_wpe;
    serial_embedding_backward(expected_wte, with_positions ? &expected_wpe : nullptr, d_out, tokens,
                              B, T, C);
    embedding_backward(d_wte.data(), with_positions ? d_wpe.data() : nullptr, d_out.data(),
                       tokens.data(), B, T, C);
    EXPECT_EQ(0, std::memcmp(d_wte.data(), expected_wte.data(), d_wte.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_wpe.data(), expected_wpe.data(), d_wpe.size() * sizeof(float)));
  }
}

TEST(Embedding, BitIdenticalForAnyThreadCount) {
  const int64_t B = 4, T = 129, C = 768, vocab = 37;
  const auto tokens = random_tokens(B * T, vocab, 15);
  const auto wte = random_vector(vocab * C, 16), wpe = random_vector(T * C, 17);
  const auto d_out = random_vector(B * T * C, 18);
  std::vector<float> baseline_out, baseline_d_wte, baseline_d_wpe;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    testing::ScopedOmpThreads scoped(threads);
    std::vector<float> out(B * T * C), d_wte(vocab * C, 0.25f), d_wpe(T * C, -0.5f);
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    embedding_backward(d_wte.data(), d_wpe.data(), d_out.data(), tokens.data(), B, T, C);
    if (threads == 1) {
      baseline_out = out;
      baseline_d_wte = d_wte;
      baseline_d_wpe = d_wpe;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(out.data(), baseline_out.data(), out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_wte.data(), baseline_d_wte.data(), d_wte.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(d_wpe.data(), baseline_d_wpe.data(), d_wpe.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace lattice::kernels
