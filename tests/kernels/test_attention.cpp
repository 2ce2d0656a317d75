// Tests of the tiled causal GQA attention kernels against a naive double-precision reference that
// materialises the causal softmax (forward and its analytic gradient), finite differences, the bf16
// mode, strided layouts (packed qkv, KV cache) and thread-count invariance.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "attention_reference.hpp"
#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/attention.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

// Where q, k and v live: a packed [B, T, (Hq + 2 Hkv) D] qkv buffer, or separate buffers whose rows
// carry `row_pad` unused floats and whose k/v batches hold `kv_capacity` rows (a KV cache).
struct Layout {
  AttentionShape shape;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;  // into q_buf / kv_buf
  int64_t q_size = 0, kv_size = 0;
  bool packed = false;
};

Layout make_layout(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                   bool packed, int64_t row_pad = 0, int64_t kv_capacity = 0) {
  Layout l;
  AttentionShape& s = l.shape;
  s.batch = B, s.q_len = Tq, s.kv_len = Tk, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = D;
  l.packed = packed;
  if (packed) {
    const int64_t row = (Hq + 2 * Hkv) * D + row_pad;
    s.q_row_stride = s.k_row_stride = s.v_row_stride = row;
    s.q_batch_stride = s.kv_batch_stride = Tq * row;
    l.q_offset = 0, l.k_offset = Hq * D, l.v_offset = (Hq + Hkv) * D;
    l.q_size = B * Tq * row;
  } else {
    const int64_t capacity = std::max(kv_capacity, Tk);
    s.q_row_stride = Hq * D + row_pad;
    s.q_batch_stride = Tq * s.q_row_stride;
    // k and v share one buffer per token row: [k heads | v heads | pad].
    s.k_row_stride = s.v_row_stride = 2 * Hkv * D + row_pad;
    s.kv_batch_stride = capacity * s.k_row_stride;
    l.k_offset = 0, l.v_offset = Hkv * D;
    l.q_size = B * s.q_batch_stride;
    l.kv_size = B * s.kv_batch_stride;
  }
  return l;
}

// Dense copies [B, T, H, D] of the strided q, k, v.
std::vector<double> gather(const float* base, int64_t B, int64_t T, int64_t H, int64_t D,
                           int64_t row_stride, int64_t batch_stride) {
  std::vector<double> out(static_cast<size_t>(B * T * H * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * D; ++i)
        out[static_cast<size_t>((b * T + t) * H * D + i)] =
            base[b * batch_stride + t * row_stride + i];
  return out;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The naive double-precision reference (masked softmax, materialised P, analytic gradient).
using attention_testing::naive_attention;
using attention_testing::Reference;

// Inputs of one case, filled with N(0, 1) so scores have spread 1 after the 1/sqrt(D) scale.
struct Case {
  Layout layout;
  std::vector<float> q_buf, kv_buf;
  const float* q() const { return q_buf.data() + layout.q_offset; }
  const float* k() const { return (layout.packed ? q_buf : kv_buf).data() + layout.k_offset; }
  const float* v() const { return (layout.packed ? q_buf : kv_buf).data() + layout.v_offset; }
  std::vector<double> dense_q() const {
    const auto& s = layout.shape;
    return gather(q(), s.batch, s.q_len, s.q_heads, s.head_dim, s.q_row_stride, s.q_batch_stride);
  }
  std::vector<double> dense_k() const {
    const auto& s = layout.shape;
    return gather(k(), s.batch, s.kv_len, s.kv_heads, s.head_dim, s.k_row_stride,
                  s.kv_batch_stride);
  }
  std::vector<double> dense_v() const {
    const auto& s = layout.shape;
    return gather(v(), s.batch, s.kv_len, s.kv_heads, s.head_dim, s.v_row_stride,
                  s.kv_batch_stride);
  }
};

Case make_case(const Layout& layout, uint64_t seed) {
  Case c;
  c.layout = layout;
  c.q_buf = random_vector(layout.q_size, seed);
  if (!layout.packed) c.kv_buf = random_vector(layout.kv_size, seed + 1);
  return c;
}

struct ForwardResult {
  std::vector<float> out, lse;
};

ForwardResult run_forward(const Case& c, Precision precision,
                          const AttentionOptions& options = {}) {
  const auto& s = c.layout.shape;
  ForwardResult r;
  r.out.assign(static_cast<size_t>(s.batch * s.q_len * s.q_heads * s.head_dim), 0.0f);
  r.lse.assign(static_cast<size_t>(s.batch * s.q_heads * s.q_len), 0.0f);
  MatmulEngine engine;
  attention_forward(r.out.data(), r.lse.data(), c.q(), c.k(), c.v(), s, precision, engine, options);
  return r;
}

// Gradients written into buffers shaped like the inputs' (NaN-filled so untouched gaps show).
struct BackwardResult {
  std::vector<float> dq_buf, dkv_buf;
  std::vector<double> dq, dk, dv;  // dense gathers
};

BackwardResult run_backward(const Case& c, const ForwardResult& f, const std::vector<float>& d_out,
                            Precision precision, const AttentionOptions& options = {}) {
  const auto& s = c.layout.shape;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  BackwardResult r;
  r.dq_buf.assign(c.q_buf.size(), nan);
  r.dkv_buf.assign(c.kv_buf.size(), nan);
  float* dq = r.dq_buf.data() + c.layout.q_offset;
  float* dk = (c.layout.packed ? r.dq_buf : r.dkv_buf).data() + c.layout.k_offset;
  float* dv = (c.layout.packed ? r.dq_buf : r.dkv_buf).data() + c.layout.v_offset;
  MatmulEngine engine;
  attention_backward(dq, dk, dv, d_out.data(), c.q(), c.k(), c.v(), f.out.data(), f.lse.data(), s,
                     precision, engine, options);
  r.dq = gather(dq, s.batch, s.q_len, s.q_heads, s.head_dim, s.q_row_stride, s.q_batch_stride);
  r.dk = gather(dk, s.batch, s.kv_len, s.kv_heads, s.head_dim, s.k_row_stride, s.kv_batch_stride);
  r.dv = gather(dv, s.batch, s.kv_len, s.kv_heads, s.head_dim, s.v_row_stride, s.kv_batch_stride);
  return r;
}

// fp32 tolerance: each output sums up to ~T products of unit-scale fp32 values and the kernel's exp
// has a relative error below 2e-7, so errors stay near 1e-6 of the outputs' scale; 2e-5 leaves
// margin yet catches any indexing or masking mistake (those give errors of order 1).
constexpr double kFp32Tolerance = 2e-5;

void expect_forward_matches(const Layout& layout, uint64_t seed) {
  const Case c = make_case(layout, seed);
  const ForwardResult f = run_forward(c, Precision::fp32);
  const Reference ref =
      naive_attention(c.dense_q(), c.dense_k(), c.dense_v(), layout.shape, nullptr);
  EXPECT_LT(max_relative_error(f.out, ref.out), kFp32Tolerance);
  EXPECT_LT(max_relative_error(f.lse, ref.lse), kFp32Tolerance);
}

TEST(AttentionForward, MatchesNaiveReferenceAcrossShapes) {
  struct Dims {
    int64_t B, T, Hq, Hkv, D;
  };
  // T = 1, T below / not a multiple of / above the 64-row tile, GQA ratios 1, 2, 4, head_dim 16, 24
  // (not a multiple of the 16-lane vector), 64 and 128.
  const Dims dims[] = {{1, 1, 1, 1, 64},   {2, 5, 2, 1, 16},   {1, 64, 2, 2, 64},
                       {2, 100, 4, 2, 64}, {1, 130, 4, 1, 16}, {1, 77, 2, 2, 24},
                       {1, 129, 2, 1, 128}};
  uint64_t seed = 10;
  for (const Dims& d : dims) {
    SCOPED_TRACE(::testing::Message() << "B=" << d.B << " T=" << d.T << " Hq=" << d.Hq
                                      << " Hkv=" << d.Hkv << " D=" << d.D);
    expect_forward_matches(make_layout(d.B, d.T, d.T, d.Hq, d.Hkv, d.D, false), seed++);
  }
}

TEST(AttentionForward, ContiguousShapeHasTrainingStrides) {
  const AttentionShape s = AttentionShape::contiguous(2, 10, 6, 2, 8);
  EXPECT_EQ(s.q_len, 10);
  EXPECT_EQ(s.kv_len, 10);
  EXPECT_EQ(s.q_row_stride, 48);
  EXPECT_EQ(s.k_row_stride, 16);
  EXPECT_EQ(s.v_row_stride, 16);
  EXPECT_EQ(s.q_batch_stride, 480);
  EXPECT_EQ(s.kv_batch_stride, 160);
}

TEST(AttentionForward, PackedQkvAndPaddedRows) {
  expect_forward_matches(make_layout(2, 70, 70, 4, 2, 32, true), 31);
  expect_forward_matches(make_layout(1, 90, 90, 2, 2, 64, true, /*row_pad=*/5), 32);
  expect_forward_matches(make_layout(2, 67, 67, 4, 4, 16, false, /*row_pad=*/3), 33);
}

TEST(AttentionForward, KvCacheWithShorterQuery) {
  // Decode (q_len 1), a short chunk, a chunk straddling tiles with an unaligned causal offset; the
  // cache holds more rows than kv_len so the batch stride differs from kv_len rows.
  expect_forward_matches(make_layout(2, 1, 200, 4, 2, 64, false, 0, 256), 41);
  expect_forward_matches(make_layout(1, 3, 77, 2, 1, 16, false, 2, 80), 42);
  expect_forward_matches(make_layout(2, 70, 150, 4, 1, 32, false, 0, 160), 43);
}

TEST(AttentionForward, RejectsImpossibleShapes) {
  MatmulEngine engine;
  std::vector<float> buf(4096, 0.0f);
  AttentionShape s = AttentionShape::contiguous(1, 4, 3, 2, 8);  // 3 heads over 2 kv heads
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), s,
                                 Precision::fp32, engine),
               Error);
  s = AttentionShape::contiguous(1, 4, 2, 2, 8);
  s.kv_len = 3;  // fewer keys than queries
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), s,
                                 Precision::fp32, engine),
               Error);
  // (Backward with kv_len != q_len is general attention now: test_attention_general.cpp.)
  s = AttentionShape::contiguous(1, 4, 3, 1, 8);  // backward too: 3 heads over 1 kv head is fine,
  s.kv_heads = 2;                                 // over 2 it is not
  EXPECT_THROW(
      attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                         buf.data(), buf.data(), buf.data(), s, Precision::fp32, engine),
      Error);
}

void expect_backward_matches(const Layout& layout, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Case c = make_case(layout, seed);
  const auto& s = layout.shape;
  const ForwardResult f = run_forward(c, Precision::fp32);
  const std::vector<float> d_out = random_vector(static_cast<int64_t>(f.out.size()), seed + 100);
  const BackwardResult g = run_backward(c, f, d_out, Precision::fp32);
  const Reference ref = naive_attention(c.dense_q(), c.dense_k(), c.dense_v(), s, &d_out);
  // Errors relative to the largest gradient of the three: with one key (T = 1) dq and dk are
  // exactly zero and only rounding-level values are expected there.
  const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  EXPECT_LT(max_abs_difference(g.dq, ref.dq) / scale, kFp32Tolerance);
  EXPECT_LT(max_abs_difference(g.dk, ref.dk) / scale, kFp32Tolerance);
  EXPECT_LT(max_abs_difference(g.dv, ref.dv) / scale, kFp32Tolerance);
  // Only the gradients' own elements are written: row padding keeps its NaN sentinels.
  int64_t written = 0;
  for (float x : g.dq_buf) written += !std::isnan(x);
  for (float x : g.dkv_buf) written += !std::isnan(x);
  EXPECT_EQ(written, s.batch * s.q_len * (s.q_heads + 2 * s.kv_heads) * s.head_dim);
}

TEST(AttentionBackward, MatchesNaiveAnalyticGradient) {
  expect_backward_matches(make_layout(1, 1, 1, 2, 1, 16, false), 50);
  expect_backward_matches(make_layout(2, 100, 100, 4, 2, 64, false), 51);   // GQA 2, T % 64 != 0
  expect_backward_matches(make_layout(1, 130, 130, 4, 1, 16, false), 52);   // GQA 4
  expect_backward_matches(make_layout(2, 64, 64, 2, 2, 64, false), 53);     // exactly one tile
  expect_backward_matches(make_layout(1, 70, 70, 2, 2, 24, false, 3), 54);  // D % 16 != 0, padding
}

TEST(AttentionBackward, PackedQkvGradientsLandInPackedBuffer) {
  expect_backward_matches(make_layout(2, 90, 90, 4, 2, 32, true), 61);
  expect_backward_matches(make_layout(1, 65, 65, 2, 1, 64, true, /*row_pad=*/4), 62);
}

TEST(AttentionBackward, MatchesFiniteDifferences) {
  // Loss L = sum_i w_i out_i of the kernel itself (fp32), differentiated numerically in q, k and v.
  // Step 1e-2 on unit-scale inputs: truncation error ~step^2 = 1e-4 relative, fp32 rounding noise
  // in L ~1e-7 * |L| / step ~ 1e-5; the 2e-3 bound covers both and still catches any wrong term.
  const Layout layout = make_layout(1, 9, 9, 4, 2, 8, true);
  Case c = make_case(layout, 70);
  // ~1000 tiny forward calls: one thread avoids paying a parallel region for each.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const ForwardResult f = run_forward(c, Precision::fp32);
  const std::vector<float> w = random_vector(static_cast<int64_t>(f.out.size()), 71);
  const BackwardResult g = run_backward(c, f, w, Precision::fp32);
  auto loss = [&] { return testing::weighted_sum(run_forward(c, Precision::fp32).out, w); };
  const std::vector<double> numeric = testing::numerical_gradient(
      loss, c.q_buf.data(), static_cast<int64_t>(c.q_buf.size()), 1e-2f);
  // The packed buffer holds q, k and v: its numerical gradient is the packed dqkv.
  omp_set_num_threads(saved_threads);
  std::vector<double> analytic(g.dq_buf.begin(), g.dq_buf.end());
  EXPECT_LT(max_relative_error(analytic, numeric), 2e-3);
}

// Runs body(options) on the default bf16 path (AMX where available) and on the portable one.
template <class Body>
void for_each_bf16_path(Body body) {
  for (const bool allow_amx : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "allow_amx=" << allow_amx);
    AttentionOptions options;
    options.allow_amx = allow_amx;
    body(options);
  }
}

TEST(AttentionBf16, WithinBf16ToleranceOfDoubleReference) {
  // bf16 rounds q, k, v, d_out, P and dS to 8 significant bits (relative 2^-9 = 2e-3 each) and
  // accumulates in fp32; errors of a few of those rounding steps relative to the outputs' scale are
  // expected, so the bound is 1.5e-2 (fp32 stays below 2e-5). The error must also exceed fp32's,
  // which shows the rounding really happens.
  for_each_bf16_path([](const AttentionOptions& options) {
    const Layout layout = make_layout(2, 100, 100, 4, 2, 64, false);
    const Case c = make_case(layout, 80);
    const ForwardResult f = run_forward(c, Precision::bf16, options);
    const std::vector<float> d_out = random_vector(static_cast<int64_t>(f.out.size()), 81);
    const BackwardResult g = run_backward(c, f, d_out, Precision::bf16, options);
    const Reference ref =
        naive_attention(c.dense_q(), c.dense_k(), c.dense_v(), layout.shape, &d_out);
    const double out_error = max_relative_error(f.out, ref.out);
    EXPECT_LT(out_error, 1.5e-2);
    EXPECT_GT(out_error, kFp32Tolerance);
    EXPECT_LT(max_relative_error(f.lse, ref.lse), 1.5e-2);
    EXPECT_LT(max_relative_error(g.dq, ref.dq), 1.5e-2);
    EXPECT_LT(max_relative_error(g.dk, ref.dk), 1.5e-2);
    EXPECT_LT(max_relative_error(g.dv, ref.dv), 1.5e-2);
  });
}

TEST(AttentionBf16, ForwardAcrossShapesAndLayouts) {
  // The bf16 forward has its own tile code (AMX where the CPU has it): T = 1, ragged T, GQA 1/2/4,
  // head_dim 16, 24 and 64, packed qkv and a KV cache with q_len < kv_len. Same 1.5e-2 bound.
  for_each_bf16_path([](const AttentionOptions& options) {
    const Layout layouts[] = {make_layout(1, 1, 1, 2, 1, 64, false),
                              make_layout(2, 100, 100, 4, 1, 16, false),
                              make_layout(1, 77, 77, 2, 2, 24, false, 3),
                              make_layout(2, 70, 70, 4, 2, 64, true),
                              make_layout(2, 1, 200, 4, 2, 64, false, 0, 256),
                              make_layout(1, 70, 150, 4, 1, 32, false, 0, 160),
                              make_layout(1, 130, 130, 2, 2, 64, false)};
    uint64_t seed = 200;
    for (const Layout& layout : layouts) {
      const auto& s = layout.shape;
      SCOPED_TRACE(::testing::Message()
                   << "Tq=" << s.q_len << " Tk=" << s.kv_len << " Hq=" << s.q_heads
                   << " Hkv=" << s.kv_heads << " D=" << s.head_dim);
      const Case c = make_case(layout, seed++);
      const ForwardResult f = run_forward(c, Precision::bf16, options);
      const Reference ref = naive_attention(c.dense_q(), c.dense_k(), c.dense_v(), s, nullptr);
      EXPECT_LT(max_relative_error(f.out, ref.out), 1.5e-2);
      EXPECT_LT(max_relative_error(f.lse, ref.lse), 1.5e-2);
    }
  });
}

TEST(AttentionBf16, BackwardAcrossShapesAndLayouts) {
  // The bf16 backward (AMX where the CPU has it): one key, ragged T, GQA 1/2/4, head_dim 16, 24 and
  // 64, packed qkv and padded rows. Errors relative to the largest gradient, bound 1.5e-2 as above;
  // padding keeps its NaN sentinels.
  for_each_bf16_path([](const AttentionOptions& options) {
    const Layout layouts[] = {
        make_layout(1, 1, 1, 2, 1, 16, false), make_layout(2, 100, 100, 4, 1, 16, false),
        make_layout(1, 77, 77, 2, 2, 24, false, 3), make_layout(2, 70, 70, 4, 2, 64, true),
        make_layout(1, 130, 130, 2, 2, 64, true, 5)};
    uint64_t seed = 300;
    for (const Layout& layout : layouts) {
      const auto& s = layout.shape;
      SCOPED_TRACE(::testing::Message() << "T=" << s.q_len << " Hq=" << s.q_heads
                                        << " Hkv=" << s.kv_heads << " D=" << s.head_dim);
      const Case c = make_case(layout, seed);
      const ForwardResult f = run_forward(c, Precision::bf16, options);
      const std::vector<float> d_out = random_vector(static_cast<int64_t>(f.out.size()), seed + 1);
      seed += 2;
      const BackwardResult g = run_backward(c, f, d_out, Precision::bf16, options);
      const Reference ref = naive_attention(c.dense_q(), c.dense_k(), c.dense_v(), s, &d_out);
      const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
      EXPECT_LT(max_abs_difference(g.dq, ref.dq) / scale, 1.5e-2);
      EXPECT_LT(max_abs_difference(g.dk, ref.dk) / scale, 1.5e-2);
      EXPECT_LT(max_abs_difference(g.dv, ref.dv) / scale, 1.5e-2);
      int64_t written = 0;
      for (float x : g.dq_buf) written += !std::isnan(x);
      for (float x : g.dkv_buf) written += !std::isnan(x);
      EXPECT_EQ(written, s.batch * s.q_len * (s.q_heads + 2 * s.kv_heads) * s.head_dim);
    }
  });
}

std::vector<lattice::bf16> to_bf16_vector(const std::vector<float>& x) {
  std::vector<lattice::bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_bf16(x[i]);
  return out;
}

// attention_forward_bf16 / attention_backward_bf16 on bf16 copies of a case's buffers against
// attention_forward / attention_backward with Precision::bf16 on the fp32 ones: the kernels round
// the fp32 inputs to exactly those bf16 values, so the results must agree bit for bit; the bf16
// gradients must be the fp32 ones rounded, and each batch's column sums their sum in token order.
void expect_bf16_inputs_match(const Layout& layout, uint64_t seed, bool backward,
                              const AttentionOptions& options) {
  const Case c = make_case(layout, seed);
  const auto& s = layout.shape;
  const std::vector<lattice::bf16> q16 = to_bf16_vector(c.q_buf), kv16 = to_bf16_vector(c.kv_buf);
  const lattice::bf16* q = q16.data() + layout.q_offset;
  const lattice::bf16* k = (layout.packed ? q16 : kv16).data() + layout.k_offset;
  const lattice::bf16* v = (layout.packed ? q16 : kv16).data() + layout.v_offset;

  const ForwardResult expected = run_forward(c, Precision::bf16, options);
  ForwardResult got;
  got.out.assign(expected.out.size(), -1.0f);
  got.lse.assign(expected.lse.size(), -1.0f);
  attention_forward_bf16(got.out.data(), got.lse.data(), q, k, v, s, options);
  EXPECT_EQ(got.out, expected.out);
  EXPECT_EQ(got.lse, expected.lse);
  if (!backward) return;

  const std::vector<float> d_out =
      random_vector(static_cast<int64_t>(expected.out.size()), seed + 1);
  const BackwardResult fp32 = run_backward(c, expected, d_out, Precision::bf16, options);
  const lattice::bf16 sentinel{0x7fc1};  // a NaN: untouched padding keeps it
  std::vector<lattice::bf16> dq_buf(q16.size(), sentinel), dkv_buf(kv16.size(), sentinel);
  const int64_t q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const int64_t sums_stride = q_width + 2 * kv_width;
  std::vector<double> sums(static_cast<size_t>(s.batch * sums_stride), -1.0);
  AttentionGradientsBf16 grads;
  grads.dq = dq_buf.data() + layout.q_offset;
  grads.dk = (layout.packed ? dq_buf : dkv_buf).data() + layout.k_offset;
  grads.dv = (layout.packed ? dq_buf : dkv_buf).data() + layout.v_offset;
  grads.dq_sums = sums.data();
  grads.dk_sums = sums.data() + q_width;
  grads.dv_sums = sums.data() + q_width + kv_width;
  grads.sums_batch_stride = sums_stride;
  attention_backward_bf16(grads, d_out.data(), q, k, v, expected.out.data(), expected.lse.data(), s,
                          options);
  // Every element of the bf16 buffers: the rounded fp32 gradient where one is written, the
  // sentinel elsewhere.
  const std::vector<float>& fp32_dq = fp32.dq_buf;
  const std::vector<float>& fp32_dkv = layout.packed ? fp32.dq_buf : fp32.dkv_buf;
  int64_t mismatches = 0;
  for (size_t i = 0; i < dq_buf.size(); ++i)
    mismatches += std::isnan(fp32_dq[i]) ? dq_buf[i].bits != sentinel.bits
                                         : dq_buf[i].bits != to_bf16(fp32_dq[i]).bits;
  if (!layout.packed)
    for (size_t i = 0; i < dkv_buf.size(); ++i)
      mismatches += std::isnan(fp32_dkv[i]) ? dkv_buf[i].bits != sentinel.bits
                                            : dkv_buf[i].bits != to_bf16(fp32_dkv[i]).bits;
  EXPECT_EQ(mismatches, 0);
  // Column sums: the fp32 gradients (dense gathers, exact in double) summed per batch in token
  // order.
  const std::vector<double>* dense[] = {&fp32.dq, &fp32.dk, &fp32.dv};
  const int64_t widths[] = {q_width, kv_width, kv_width};
  const int64_t offsets[] = {0, q_width, q_width + kv_width};
  for (int which = 0; which < 3; ++which)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t j = 0; j < widths[which]; ++j) {
        double expected_sum = 0.0;
        for (int64_t t = 0; t < s.q_len; ++t)
          expected_sum +=
              (*dense[which])[static_cast<size_t>((b * s.q_len + t) * widths[which] + j)];
        ASSERT_EQ(sums[static_cast<size_t>(b * sums_stride + offsets[which] + j)], expected_sum)
            << "gradient " << which << " batch " << b << " column " << j;
      }
  // Without column sums the rows are the same.
  std::vector<lattice::bf16> dq_again(q16.size(), sentinel), dkv_again(kv16.size(), sentinel);
  AttentionGradientsBf16 rows_only;
  rows_only.dq = dq_again.data() + layout.q_offset;
  rows_only.dk = (layout.packed ? dq_again : dkv_again).data() + layout.k_offset;
  rows_only.dv = (layout.packed ? dq_again : dkv_again).data() + layout.v_offset;
  attention_backward_bf16(rows_only, d_out.data(), q, k, v, expected.out.data(),
                          expected.lse.data(), s, options);
  EXPECT_TRUE(std::equal(dq_again.begin(), dq_again.end(), dq_buf.begin(),
                         [](lattice::bf16 a, lattice::bf16 b) { return a.bits == b.bits; }));
}

TEST(AttentionBf16Inputs, EqualTheFp32InputsBitForBit) {
  // Packed qkv with and without row padding, separate buffers with GQA 2 and 4, head_dim 16, 24
  // and 64, T = 1, ragged T, T over two key blocks; a KV cache (q_len < kv_len) forward only.
  for_each_bf16_path([](const AttentionOptions& options) {
    expect_bf16_inputs_match(make_layout(2, 70, 70, 4, 4, 64, true), 400, true, options);
    expect_bf16_inputs_match(make_layout(1, 130, 130, 2, 2, 64, true, 5), 402, true, options);
    expect_bf16_inputs_match(make_layout(2, 100, 100, 4, 2, 16, false), 404, true, options);
    expect_bf16_inputs_match(make_layout(1, 77, 77, 4, 1, 24, false, 3), 406, true, options);
    expect_bf16_inputs_match(make_layout(1, 1, 1, 2, 1, 64, false), 408, true, options);
    expect_bf16_inputs_match(make_layout(2, 70, 150, 4, 1, 32, false, 0, 160), 410, false, options);
  });
}

TEST(AttentionBf16Inputs, RejectsPartialColumnSums) {
  const AttentionShape s = AttentionShape::contiguous(1, 4, 2, 2, 16);
  std::vector<lattice::bf16> buf(1024);
  std::vector<float> f(1024, 0.0f);
  std::vector<double> sums(64);
  AttentionGradientsBf16 grads{buf.data(), buf.data(),  buf.data(), sums.data(),
                               nullptr,    sums.data(), 64};
  try {
    attention_backward_bf16(grads, f.data(), buf.data(), buf.data(), buf.data(), f.data(), f.data(),
                            s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("column-sum"), std::string::npos) << e.what();
  }
}

TEST(AttentionBf16, AllowAmxFalseRunsThePortablePath) {
  // Where AMX runs, the portable path accumulates in another order, so some bits differ; where it
  // does not, both options run the portable path and agree bit for bit.
  const Case c = make_case(make_layout(2, 100, 100, 4, 2, 64, false), 95);
  AttentionOptions portable;
  portable.allow_amx = false;
  const ForwardResult amx_or_portable = run_forward(c, Precision::bf16);
  const ForwardResult forced = run_forward(c, Precision::bf16, portable);
  if (amx_tile_state_granted())
    EXPECT_NE(amx_or_portable.out, forced.out);
  else
    EXPECT_EQ(amx_or_portable.out, forced.out);
}

TEST(AttentionThreads, ResultsAreBitwiseIndependentOfThreadCount) {
  // Each query row's forward and each (batch, kv head)'s backward run on one thread in a fixed
  // order, so 1 and 3 threads must agree bit for bit, in both precisions.
  const Layout layout = make_layout(2, 150, 150, 4, 2, 32, true);
  const Case c = make_case(layout, 90);
  const int saved_threads = omp_get_max_threads();
  for (const char* path : {"fp32", "bf16", "bf16-portable"}) {
    const Precision precision = path[0] == 'f' ? Precision::fp32 : Precision::bf16;
    AttentionOptions options;
    options.allow_amx = std::string_view(path) != "bf16-portable";
    std::vector<std::vector<float>> outs, grads;
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const ForwardResult f = run_forward(c, precision, options);
      const std::vector<float> d_out = random_vector(static_cast<int64_t>(f.out.size()), 91);
      outs.push_back(f.out);
      grads.push_back(run_backward(c, f, d_out, precision, options).dq_buf);
    }
    EXPECT_EQ(outs[0], outs[1]) << path;
    EXPECT_EQ(grads[0], grads[1]) << path;
  }
  omp_set_num_threads(saved_threads);
}

}  // namespace
}  // namespace lattice::kernels
