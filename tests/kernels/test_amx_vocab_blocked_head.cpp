// Tests of the vocabulary-blocked LM head: one pass against a double-precision reference of the
// head and its cross-entropy on the same bf16 values (vocabularies that are not multiples of the
// block or of 32, rows that are not multiples of 32, ignored targets, the weight gradient written
// and added to), the rows a pass takes per width, MatmulEngine's multi-threaded call against the
// row-chunk head with cross_entropy_rows_bf16, and bad shapes. Skipped where the CPU or kernel
// grants no AMX tile state.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/scoped_omp_threads.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_vocab_blocked_head.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/matmul.hpp"

namespace lattice::kernels {
namespace {

using lattice::testing::random_vector;
using lattice::testing::rounded_to_bf16;

struct Head {
  int64_t rows, K, V;
  std::vector<lattice::bf16> in16, weight16;
  std::vector<float> weight;  // the bf16 weight's values, for MatmulEngine
  std::vector<int32_t> targets;
};

// Logits of about one unit (uniform inputs in [-1, 1], weights in [-3/sqrt(K), 3/sqrt(K)]) so the
// softmax is not flat; every
// seventh target ignored.
Head make_head(int64_t rows, int64_t K, int64_t V, uint64_t seed) {
  Head h{rows, K, V, {}, {}, {}, {}};
  h.in16 = rounded_to_bf16(random_vector(rows * K, seed, 1.0f));
  h.weight16 = rounded_to_bf16(random_vector(V * K, seed + 1, 3.0f / std::sqrt(float(K))));
  for (lattice::bf16 w : h.weight16) h.weight.push_back(lattice::to_float(w));
  for (int64_t r = 0; r < rows; ++r)
    h.targets.push_back(r % 7 == 3 ? -1 : static_cast<int32_t>((r * 7919 + 13) % V));
  return h;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> d_in, weight_grad;
};

// One pass through the kernel; the weight gradient starts from `weight_grad_before` (added to) or
// is overwritten.
Result run_pass(const Head& h, float grad_scale, bool overwrite,
                const std::vector<float>& weight_grad_before) {
  std::vector<uint16_t> forward(vocab_blocked_head_packed_elements(h.V, h.K));
  std::vector<uint16_t> backward(forward.size());
  const uint16_t* rows =
      pack_vocab_blocked_head(forward.data(), backward.data(), h.weight16.data(), h.V, h.K);
  std::vector<char> scratch(vocab_blocked_head_scratch_bytes(h.rows, h.K, h.V) + 64);
  void* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  Result out{std::vector<double>(h.rows, -1.0), std::vector<float>(h.rows * h.K, 7.0f),
             weight_grad_before};
  vocab_blocked_head_pass(out.losses.data(), out.d_in.data(), out.weight_grad.data(), overwrite,
                          h.in16.data(), h.targets.data(), h.rows, h.K, h.V, grad_scale, rows,
                          backward.data(), aligned);
  return out;
}

// The exact head in double on the bf16 values: losses, the logits' gradient d [rows, V] (scaled,
// unrounded), and d's products with their absolute-value bounds.
struct Reference {
  std::vector<double> losses, d, d_in, d_in_bound, weight_grad, weight_grad_bound;
};

Reference reference(const Head& h, float grad_scale) {
  const int64_t rows = h.rows, K = h.K, V = h.V;
  Reference ref{std::vector<double>(rows, 0.0),     std::vector<double>(rows * V, 0.0),
                std::vector<double>(rows * K, 0.0), std::vector<double>(rows * K, 0.0),
                std::vector<double>(V * K, 0.0),    std::vector<double>(V * K, 0.0)};
  std::vector<double> logits(V);
  for (int64_t r = 0; r < rows; ++r) {
    if (h.targets[r] < 0) continue;
    for (int64_t v = 0; v < V; ++v) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k)
        sum += static_cast<double>(lattice::to_float(h.in16[r * K + k])) * h.weight[v * K + k];
      logits[v] = sum;
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (double l : logits) total += std::exp(l - max);
    ref.losses[r] = max + std::log(total) - logits[h.targets[r]];
    for (int64_t v = 0; v < V; ++v)
      ref.d[r * V + v] = std::exp(logits[v] - max) / total * grad_scale -
                         (v == h.targets[r] ? static_cast<double>(grad_scale) : 0.0);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v) {
      const double d = ref.d[r * V + v];
      if (d == 0.0) continue;
      for (int64_t k = 0; k < K; ++k) {
        const double w = h.weight[v * K + k], x = lattice::to_float(h.in16[r * K + k]);
        ref.d_in[r * K + k] += d * w;
        ref.d_in_bound[r * K + k] += std::fabs(d * w);
        ref.weight_grad[v * K + k] += d * x;
        ref.weight_grad_bound[v * K + k] += std::fabs(d * x);
      }
    }
  return ref;
}

// d is rounded to bf16 before its products (relative error at most 2^-9 per term), and the fp32
// logits carry sums over K; each product is within 2^-8 of the sum of its terms' magnitudes.
constexpr double kBf16Step = 1.0 / 256.0;

void expect_pass_matches_reference(int64_t rows, int64_t K, int64_t V, bool overwrite) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " K=" << K << " V=" << V
                                    << (overwrite ? " overwrite" : " add"));
  const Head h = make_head(rows, K, V, 100 + rows + K + V);
  const float grad_scale = 1.0f / static_cast<float>(rows);
  const std::vector<float> before = random_vector(V * K, 9, 0.01f);
  const Result got = run_pass(h, grad_scale, overwrite, before);
  const Reference ref = reference(h, grad_scale);
  for (int64_t r = 0; r < rows; ++r) {
    // fp32 logits (sums of K bf16 products of about 1): about 1e-6 of the loss of a few units.
    EXPECT_NEAR(got.losses[r], ref.losses[r], 2e-5) << "row " << r;
    if (h.targets[r] < 0) {
      EXPECT_EQ(got.losses[r], 0.0) << "ignored row " << r;
    }
  }
  for (int64_t i = 0; i < rows * K; ++i)
    ASSERT_NEAR(got.d_in[i], ref.d_in[i], kBf16Step * ref.d_in_bound[i] + 1e-9) << "d_in " << i;
  for (int64_t i = 0; i < V * K; ++i) {
    const double start = overwrite ? 0.0 : before[i];
    ASSERT_NEAR(got.weight_grad[i], start + ref.weight_grad[i],
                kBf16Step * ref.weight_grad_bound[i] + 1e-6 * std::fabs(start) + 1e-9)
        << "weight_grad " << i;
  }
}

bool have_amx() {
  return amx_packed_gemm_enabled();
}

TEST(VocabBlockedHead, RowsPerPassKeepAPassInL2) {
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(32), 512);
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(256), 512);  // 1 MiB: 512 rows x 256 x 8 bytes
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(512), 256);
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(768), 0);  // GPT-2 124M: the row-chunk head
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(48), 0);   // not a multiple of 32
  EXPECT_EQ(vocab_blocked_head_rows_per_pass(0), 0);
}

TEST(VocabBlockedHead, OnePassMatchesADoubleReference) {
  if (!have_amx()) GTEST_SKIP() << "no AMX tile state";
  // Vocabularies below, at and past the 256-column block, not multiples of 32; rows not
  // multiples of 32; widths of one and several tiles.
  expect_pass_matches_reference(300, 64, 1000, true);
  expect_pass_matches_reference(300, 64, 1000, false);
  expect_pass_matches_reference(64, 32, 256, true);
  expect_pass_matches_reference(33, 96, 31, false);
  expect_pass_matches_reference(512, 32, 600, true);
  expect_pass_matches_reference(1, 32, 40, true);
}

TEST(VocabBlockedHead, ZeroRowsLeaveEverythingUntouched) {
  if (!have_amx()) GTEST_SKIP() << "no AMX tile state";
  const Head h = make_head(0, 32, 64, 3);
  const std::vector<float> before = random_vector(64 * 32, 4, 1.0f);
  EXPECT_EQ(run_pass(h, 1.0f, true, before).weight_grad, before);
}

TEST(VocabBlockedHead, RefusesShapesItDoesNotTake) {
  if (!have_amx()) GTEST_SKIP() << "no AMX tile state";
  const Head wide = make_head(2, 48, 40, 5);
  EXPECT_THROW(run_pass(wide, 1.0f, true, std::vector<float>(40 * 48)), Error);  // K % 32 != 0
  const Head many = make_head(600, 256, 40, 6);  // more rows than a pass of width 256 takes
  EXPECT_THROW(run_pass(many, 1.0f, true, std::vector<float>(40 * 256)), Error);
}

// MatmulEngine's call, lanes on two threads, against the row-chunk head and
// cross_entropy_rows_bf16 on the same rows: the softmax sums differ in order only (losses to fp32
// rounding), so a d value can round to the neighbouring bf16 (2^-8 of itself) where its fp32
// value sits near a rounding boundary; products agree to that.
TEST(VocabBlockedHead, MatmulEngineCallMatchesTheRowChunkHead) {
  if (!have_amx()) GTEST_SKIP() << "no AMX tile state";
  ScopedOmpThreads two_threads(2);
  const int64_t M = 1100, K = 64, V = 700;
  const Head h = make_head(M, K, V, 21);
  const float grad_scale = 1.0f / M;
  MatmulEngine matmul;
  ASSERT_TRUE(MatmulEngine::vocab_blocked_head_applies(K));
  const int lanes = MatmulEngine::vocab_blocked_lanes(M);
  EXPECT_EQ(lanes, 2);
  std::vector<double> losses(M);
  std::vector<float> d_in(M * K), partials(lanes * V * K);
  matmul.head_cross_entropy_vocab_blocked(h.in16.data(), h.weight.data(), M, K, V, h.targets.data(),
                                          grad_scale, losses.data(), d_in.data(), partials.data(),
                                          lanes);
  const int chunk_lanes = MatmulEngine::gradient_lanes(M, 256);
  std::vector<double> chunk_losses(M);
  std::vector<float> chunk_d_in(M * K), chunk_partials(chunk_lanes * V * K);
  std::vector<std::vector<float>> work(2, std::vector<float>(V));
  matmul.forward_backward_in_row_chunks(
      h.in16.data(), h.weight.data(), M, K, V, 256,
      [&](int64_t begin, int64_t n, const float* out, lattice::bf16* d16, int64_t stride) {
        cross_entropy_rows_bf16(d16, chunk_losses.data() + begin, out, h.targets.data() + begin, n,
                                V, grad_scale, work[omp_get_thread_num()].data(), stride);
      },
      chunk_d_in.data(), chunk_partials.data(), chunk_lanes);
  for (int64_t r = 0; r < M; ++r)
    EXPECT_NEAR(losses[r], chunk_losses[r], 1e-6 * std::fabs(chunk_losses[r])) << "row " << r;
  const auto sum_lanes = [&](const std::vector<float>& p, int n) {
    std::vector<double> total(V * K, 0.0);
    for (int l = 0; l < n; ++l)
      for (int64_t i = 0; i < V * K; ++i) total[i] += p[l * V * K + i];
    return total;
  };
  const std::vector<double> weight_grad = sum_lanes(partials, lanes);
  const std::vector<double> chunk_weight_grad = sum_lanes(chunk_partials, chunk_lanes);
  double d_in_scale = 0.0, weight_scale = 0.0;
  for (float x : chunk_d_in) d_in_scale = std::max(d_in_scale, std::fabs(static_cast<double>(x)));
  for (double x : chunk_weight_grad) weight_scale = std::max(weight_scale, std::fabs(x));
  ASSERT_GT(d_in_scale, 0.0);
  ASSERT_GT(weight_scale, 0.0);
  for (int64_t i = 0; i < M * K; ++i)
    ASSERT_NEAR(d_in[i], chunk_d_in[i], kBf16Step * d_in_scale) << "d_in " << i;
  for (int64_t i = 0; i < V * K; ++i)
    ASSERT_NEAR(weight_grad[i], chunk_weight_grad[i], kBf16Step * weight_scale)
        << "weight_grad " << i;
}

}  // namespace
}  // namespace lattice::kernels
