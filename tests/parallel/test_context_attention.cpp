// Context-parallel attention (ring and Ulysses) on thread ranks against one attention call over
// the whole sequence: each rank's outputs, log-sum-exps and q, k, v gradients at its load-balanced
// positions must match the one-rank call's rows there, with value heads as wide as the query-key
// heads or of their own width (DeepSeek's multi-head latent attention).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/parallel/context/context_parallel_mode.hpp"
#include "lattice/parallel/context/row_copies.hpp"
#include "lattice/parallel/context/sequence_split.hpp"

namespace lattice::parallel {
namespace {

namespace k = lattice::kernels;

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

struct Case {
  ContextParallelMode mode;
  int cp;
  int64_t q_heads, kv_heads;
  k::Precision precision;
  bool packed;         // q, k, v as one [q | k | v] projection per token (GPT-2's layout)
  int64_t window = 0;  // sliding window (0: none)
  int64_t head_dim = 8;
  int64_t value_dim = 0;  // the value heads' own width (0: head_dim; DeepSeek's MLA: narrower)
};

// Rows [positions of rank r] of x [B, T, width] (row stride `stride`) into [B, T / cp, width].
std::vector<float> local_rows(const std::vector<float>& x, int64_t B, int64_t T, int64_t stride,
                              int cp, int rank) {
  const int64_t n = T / cp;
  std::vector<float> out(static_cast<size_t>(B * n * stride));
  for (const model::PositionRun& run : balanced_runs(n, cp, rank))
    copy_rows(host_memory(), out.data() + run.row * stride, stride, n * stride,
              x.data() + run.position * stride, stride, T * stride, B, run.length, stride);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  EXPECT_LE(worst, tolerance) << what;
}

void check_case(const Case& c) {
  const int64_t B = 2, T = 64, D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads;
  const int64_t Dv = c.value_dim > 0 ? c.value_dim : D;
  const int64_t A = Hq * D, W = Hkv * D, Wv = Hkv * Dv, O = Hq * Dv;  // O: one token's output
  // Layout: packed [B, T, A + W + Wv] or separate q [B, T, A], k [B, T, W] and v [B, T, Wv].
  const int64_t packed_stride = A + W + Wv;
  const int64_t q_stride = c.packed ? packed_stride : A, k_stride = c.packed ? packed_stride : W;
  const int64_t v_stride = c.packed ? packed_stride : Wv;
  const std::vector<float> qkv = random_values(B * T * packed_stride, 7);
  std::vector<float> q, kk, v;
  if (c.packed) {
    q = qkv;
  } else {
    q.assign(qkv.begin(), qkv.begin() + B * T * A);
    kk.assign(qkv.begin() + B * T * A, qkv.begin() + B * T * (A + W));
    v.assign(qkv.begin() + B * T * (A + W), qkv.end());
  }
  const float* qp = q.data();
  const float* kp = c.packed ? q.data() + A : kk.data();
  const float* vp = c.packed ? q.data() + A + W : v.data();
  k::AttentionShape full = k::AttentionShape::contiguous(B, T, Hq, Hkv, D);
  full.v_head_dim = c.value_dim;
  full.q_row_stride = q_stride;
  full.k_row_stride = k_stride;
  full.v_row_stride = v_stride;
  full.q_batch_stride = T * q_stride;
  full.kv_batch_stride = T * k_stride;
  full.v_batch_stride = T * v_stride;
  full.window = c.window;
  const std::vector<float> d_out = random_values(B * T * O, 11);
  k::CpuOps ops;
  std::vector<float> out(B * T * O), lse(B * Hq * T);
  ops.attention_forward(out.data(), lse.data(), qp, kp, vp, full, c.precision, {});
  std::vector<float> dq(q.size()), dk(c.packed ? 0 : kk.size()), dv(c.packed ? 0 : v.size());
  float* dqp = dq.data();
  float* dkp = c.packed ? dq.data() + A : dk.data();
  float* dvp = c.packed ? dq.data() + A + W : dv.data();
  ops.attention_backward(dqp, dkp, dvp, d_out.data(), qp, kp, vp, out.data(), lse.data(), full,
                         c.precision, {});
  // Ring, fp32: the ranks' partial results meet through log-sum-exp merges (in double, rounded
  // once to fp32) and the key/value gradients are fp32 sums over the ranks in another order: a
  // few fp32 ulps of values of order 1 (measured 7e-7 and 1.2e-6). Ring, bf16: the kernel rounds
  // the probabilities relative to each key block's running maximum, so other block boundaries
  // round some differently (a bf16 step, 2^-8, on a few terms; measured 2e-3 and 5e-3).
  // Ulysses runs the one-rank kernel on whole sequences of a head subset: the same arithmetic
  // per head, so fp32 is bit-identical (bf16 is held to ring's bound, as its tiles may differ).
  const bool bf16 = c.precision == k::Precision::bf16;
  const bool exact = c.mode == ContextParallelMode::ulysses && !bf16;
  const float out_tol = exact ? 0.0f : bf16 ? 1e-2f : 4e-6f;
  const float grad_tol = exact ? 0.0f : bf16 ? 2e-2f : 1e-5f;

  comm::LocalWorld world(c.cp);
  world.run([&](comm::Communicator& comm) {
    MemoryTracker tracker;
    auto attention = make_context_attention(c.mode, comm, host_memory(), &tracker);
    const int r = comm.rank();
    const int64_t n = T / c.cp;
    k::AttentionShape local = full;
    local.q_len = local.kv_len = n;
    local.q_batch_stride = n * q_stride;
    local.kv_batch_stride = n * k_stride;
    local.v_batch_stride = n * v_stride;
    std::vector<float> lq = local_rows(q, B, T, q_stride, c.cp, r);
    std::vector<float> lk = c.packed ? std::vector<float>() : local_rows(kk, B, T, W, c.cp, r);
    std::vector<float> lv = c.packed ? std::vector<float>() : local_rows(v, B, T, Wv, c.cp, r);
    const float* lqp = lq.data();
    const float* lkp = c.packed ? lq.data() + A : lk.data();
    const float* lvp = c.packed ? lq.data() + A + W : lv.data();
    std::vector<float> lout(B * n * O), llse(B * Hq * n);
    attention->forward(ops, lout.data(), llse.data(), lqp, lkp, lvp, local, c.precision);
    expect_close(lout, local_rows(out, B, T, O, c.cp, r), out_tol, "out");
    // lse [B, H, T] is a [B·H, T] table of one float per position.
    expect_close(llse, local_rows(lse, B * Hq, T, 1, c.cp, r), out_tol, "lse");
    const std::vector<float> ld_out = local_rows(d_out, B, T, O, c.cp, r);
    std::vector<float> ldq(lq.size()), ldk(lk.size()), ldv(lv.size());
    float* ldqp = ldq.data();
    float* ldkp = c.packed ? ldq.data() + A : ldk.data();
    float* ldvp = c.packed ? ldq.data() + A + W : ldv.data();
    attention->backward(ops, ldqp, ldkp, ldvp, ld_out.data(), lqp, lkp, lvp, lout.data(),
                        llse.data(), local, c.precision);
    expect_close(ldq, local_rows(dq, B, T, q_stride, c.cp, r), grad_tol, "dq (and dk, dv packed)");
    if (!c.packed) {
      expect_close(ldk, local_rows(dk, B, T, W, c.cp, r), grad_tol, "dk");
      expect_close(ldv, local_rows(dv, B, T, Wv, c.cp, r), grad_tol, "dv");
    }
    EXPECT_GE(attention->take_wait_seconds(), 0.0);
  });
}

TEST(ContextAttention, RingMatchesOneCallOnTwoAndFourRanks) {
  for (int cp : {2, 4})
    for (bool packed : {true, false})
      check_case({ContextParallelMode::ring, cp, 4, packed ? 4 : 2, k::Precision::fp32, packed});
}

TEST(ContextAttention, UlyssesMatchesOneCallOnTwoAndFourRanks) {
  for (int cp : {2, 4})
    for (bool packed : {true, false})
      check_case({ContextParallelMode::ulysses, cp, 8, packed ? 8 : 4, k::Precision::fp32, packed});
}

TEST(ContextAttention, SlidingWindowMatchesOneCall) {
  // A window of 12 positions on 64: on 4 ranks of 16 positions (two runs of 8 each), ring skips
  // the key runs wholly before a query run's window, and Ulysses passes the window to its
  // whole-sequence call; the tolerances are check_case's.
  for (int cp : {2, 4}) {
    check_case({ContextParallelMode::ring, cp, 4, 2, k::Precision::fp32, false, 12});
    check_case({ContextParallelMode::ulysses, cp, 8, 8, k::Precision::fp32, true, 12});
  }
  check_case({ContextParallelMode::ring, 4, 4, 4, k::Precision::bf16, true, 12});
}

TEST(ContextAttention, Bf16WithinTheRoundingOfTheProbabilities) {
  check_case({ContextParallelMode::ring, 2, 4, 4, k::Precision::bf16, true});
  check_case({ContextParallelMode::ulysses, 2, 4, 2, k::Precision::bf16, false});
}

TEST(ContextAttention, ValueHeadsOfTheirOwnWidthMatchOneCall) {
  // DeepSeek's multi-head latent attention: query-key heads of 16, value (and output) heads of 12;
  // ring carries [k | v] blocks of the two widths and merges outputs 12 wide, Ulysses all-to-alls
  // v, out and their gradients 12 wide. Both layouts (v in its own buffer, and packed after k);
  // the tolerances are check_case's.
  for (int cp : {2, 4})
    for (bool packed : {false, true}) {
      check_case({ContextParallelMode::ring, cp, 4, packed ? 4 : 2, k::Precision::fp32, packed, 0,
                  16, 12});
      check_case({ContextParallelMode::ulysses, cp, 8, packed ? 8 : 4, k::Precision::fp32, packed,
                  0, 16, 12});
    }
  check_case({ContextParallelMode::ring, 2, 4, 4, k::Precision::bf16, false, 0, 16, 12});
  check_case({ContextParallelMode::ulysses, 2, 4, 2, k::Precision::bf16, true, 0, 16, 12});
  check_case({ContextParallelMode::ring, 4, 4, 2, k::Precision::fp32, false, 12, 16, 12});
}

TEST(ContextAttention, LoadBalancedRunsCoverTheSequenceOnce) {
  for (int cp : {1, 2, 4, 8}) {
    std::vector<int> seen(64, 0);
    for (int r = 0; r < cp; ++r) {
      const auto runs = balanced_runs(64 / cp, cp, r);
      ASSERT_EQ(runs.size(), 2u);
      // Rank r holds chunks r and 2cp - 1 - r.
      EXPECT_EQ(runs[0].position, r * (32 / cp));
      EXPECT_EQ(runs[1].position, (2 * cp - 1 - r) * (32 / cp));
      for (const auto& run : runs)
        for (int64_t t = 0; t < run.length; ++t) ++seen[run.position + t];
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(ContextAttention, RefusesWhatCannotSplit) {
  EXPECT_THROW(check_context_parallel(ContextParallelMode::ring, 4, 1, 100, 4, 4), Error);
  EXPECT_NO_THROW(check_context_parallel(ContextParallelMode::ring, 4, 1, 96, 3, 3));
  EXPECT_THROW(check_context_parallel(ContextParallelMode::ulysses, 4, 1, 96, 6, 6), Error);
  EXPECT_THROW(check_context_parallel(ContextParallelMode::ulysses, 2, 2, 96, 4, 2), Error);
  EXPECT_NO_THROW(check_context_parallel(ContextParallelMode::ulysses, 2, 2, 96, 8, 4));
  EXPECT_THROW(parse_context_parallel_mode("star"), Error);
  try {
    check_context_parallel(ContextParallelMode::ring, 4, 1, 100, 4, 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lattice::parallel
