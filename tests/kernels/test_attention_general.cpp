// Tests of general attention: query and key lengths that differ, explicit query and key positions,
// the causal and unmasked masks, forward results over key blocks merged through their
// log-sum-exps, and the backward run block by block (ring attention), against a naive
// double-precision reference that materialises the masked softmax and its analytic gradient, and
// against finite differences. fp32 and both bf16 paths (AMX where the CPU has it, and portable).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"

namespace lattice::kernels {
namespace {

using testing::max_relative_error;
using testing::random_vector;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// fp32 tolerance, relative to the largest reference value: each output sums up to ~T products of
// unit-scale fp32 values and the kernel's exp has relative error below 2e-7, so errors stay near
// 1e-6; 2e-5 still catches any masking or offset mistake (those give errors of order 1).
constexpr double kFp32Tolerance = 2e-5;
// bf16 tolerance: q, k, v, d_out, P and dS are rounded to 8 significant bits (relative 2^-9 each)
// with fp32 accumulation; a few of those rounding steps relative to the outputs' scale is
// expected, so 1.5e-2 (the bound test_attention.cpp uses for the same reason).
constexpr double kBf16Tolerance = 1.5e-2;

// One general case: lengths, heads, positions, mask, and padded rows (k and v share one buffer
// per token row, [k heads | v heads | pad], in a cache of kv_capacity rows per batch).
struct Case {
  int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 16;
  std::optional<int64_t> q_offset;
  int64_t k_offset = 0;
  AttentionMask mask = AttentionMask::causal;
  int64_t row_pad = 0, kv_capacity = 0;

  AttentionShape shape() const {
    AttentionShape s;
    s.batch = B, s.q_len = Tq, s.kv_len = Tk, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = D;
    s.q_row_stride = Hq * D + row_pad;
    s.q_batch_stride = Tq * s.q_row_stride;
    s.k_row_stride = s.v_row_stride = 2 * Hkv * D + row_pad;
    s.kv_batch_stride = std::max(kv_capacity, Tk) * s.k_row_stride;
    s.q_offset = q_offset;
    s.k_offset = k_offset;
    s.mask = mask;
    return s;
  }
  std::string name() const {
    return "B=" + std::to_string(B) + " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) +
           " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
           " q_offset=" + (q_offset ? std::to_string(*q_offset) : "default") +
           " k_offset=" + std::to_string(k_offset) +
           (mask == AttentionMask::causal ? " causal" : " none");
  }
};

// Inputs of a case: q [B, Tq, row], kv [B, capacity, row] with k then v heads, N(0, 1).
struct Inputs {
  AttentionShape s;
  std::vector<float> q_buf, kv_buf, d_out;
  const float* q() const { return q_buf.data(); }
  const float* k() const { return kv_buf.data(); }
  const float* v() const { return kv_buf.data() + s.kv_heads * s.head_dim; }
  int64_t out_size() const { return s.batch * s.q_len * s.q_heads * s.head_dim; }
  int64_t lse_size() const { return s.batch * s.q_heads * s.q_len; }
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.s = c.shape();
  in.q_buf = random_vector(in.s.batch * in.s.q_batch_stride, seed);
  in.kv_buf = random_vector(in.s.batch * in.s.kv_batch_stride, seed + 1);
  in.d_out = random_vector(in.out_size(), seed + 2);
  return in;
}

// Dense [B, T, width] doubles of strided rows.
std::vector<double> gather(const float* base, int64_t B, int64_t T, int64_t width,
                           int64_t row_stride, int64_t batch_stride) {
  std::vector<double> out(static_cast<size_t>(B * T * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; ++i)
        out[static_cast<size_t>((b * T + t) * width + i)] =
            base[b * batch_stride + t * row_stride + i];
  return out;
}

// Keys query i sees: j < visible_keys(s, i) (the mask and positions, written out independently of
// the kernel's own rule).
int64_t visible_keys(const AttentionShape& s, int64_t i) {
  if (s.mask == AttentionMask::none) return s.kv_len;
  const int64_t q_position =
      (s.q_offset ? *s.q_offset : s.k_offset + s.kv_len - s.q_len) + i;  // absolute
  // Key j at absolute position k_offset + j is seen when k_offset + j <= q_position.
  return std::clamp<int64_t>(q_position - s.k_offset + 1, 0, s.kv_len);
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // dense [B, T, H*D] and [B, Hq, Tq]
};

// Naive masked softmax attention in double, materialising P; with d_out, the analytic gradient
// dS = P * (dP - rowsum(P * dP)). A query that sees no key: out 0, lse -inf, no gradient.
Reference naive_attention(const Inputs& in, bool with_backward) {
  const AttentionShape& s = in.s;
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len, Hq = s.q_heads, Hkv = s.kv_heads,
                D = s.head_dim, group = Hq / Hkv;
  const std::vector<double> q = gather(in.q(), B, Tq, Hq * D, s.q_row_stride, s.q_batch_stride);
  const std::vector<double> k = gather(in.k(), B, Tk, Hkv * D, s.k_row_stride, s.kv_batch_stride);
  const std::vector<double> v = gather(in.v(), B, Tk, Hkv * D, s.v_row_stride, s.kv_batch_stride);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(static_cast<size_t>(B * Tq * Hq * D), 0.0);
  r.lse.assign(static_cast<size_t>(B * Hq * Tq), kNegInf);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(static_cast<size_t>(B * Tk * Hkv * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tq + t) * Hq + h) * D; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tk + t) * Hkv + h) * D; };
  std::vector<double> p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t kvh = h / group, seen = visible_keys(s, i);
        if (seen == 0) continue;
        double max_score = kNegInf;
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[qi(b, i, h) + d] * k[ki(b, j, kvh) + d];
          p[j] = dot * scale;
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        for (int64_t j = 0; j < seen; ++j) p[j] /= sum;
        r.lse[(b * Hq + h) * Tq + i] = max_score + std::log(sum);
        for (int64_t j = 0; j < seen; ++j)
          for (int64_t d = 0; d < D; ++d) r.out[qi(b, i, h) + d] += p[j] * v[ki(b, j, kvh) + d];
        if (!with_backward) continue;
        const float* g = in.d_out.data() + qi(b, i, h);
        double delta = 0;
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += g[d] * v[ki(b, j, kvh) + d];
          dp[j] = dot;
          delta += p[j] * dot;
        }
        for (int64_t j = 0; j < seen; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, i, h) + d] += ds * k[ki(b, j, kvh) + d];
            r.dk[ki(b, j, kvh) + d] += ds * q[qi(b, i, h) + d];
            r.dv[ki(b, j, kvh) + d] += p[j] * g[d];
          }
        }
      }
  return r;
}

struct Forward {
  std::vector<float> out, lse;
};

Forward run_forward(const Inputs& in, Precision precision, const AttentionOptions& options = {}) {
  Forward f;
  f.out.assign(static_cast<size_t>(in.out_size()), std::numeric_limits<float>::quiet_NaN());
  f.lse.assign(static_cast<size_t>(in.lse_size()), std::numeric_limits<float>::quiet_NaN());
  MatmulEngine engine;
  attention_forward(f.out.data(), f.lse.data(), in.q(), in.k(), in.v(), in.s, precision, engine,
                    options);
  return f;
}

// Gradients in buffers shaped like the inputs (NaN where nothing may be written).
struct Backward {
  std::vector<float> dq_buf, dkv_buf;
  float* dq() { return dq_buf.data(); }
  float* dk() { return dkv_buf.data(); }
  float* dv(const AttentionShape& s) { return dkv_buf.data() + s.kv_heads * s.head_dim; }
  std::vector<double> dense_dq(const AttentionShape& s) const {
    return gather(dq_buf.data(), s.batch, s.q_len, s.q_heads * s.head_dim, s.q_row_stride,
                  s.q_batch_stride);
  }
  std::vector<double> dense_dk(const AttentionShape& s) const {
    return gather(dkv_buf.data(), s.batch, s.kv_len, s.kv_heads * s.head_dim, s.k_row_stride,
                  s.kv_batch_stride);
  }
  std::vector<double> dense_dv(const AttentionShape& s) const {
    return gather(dkv_buf.data() + s.kv_heads * s.head_dim, s.batch, s.kv_len,
                  s.kv_heads * s.head_dim, s.v_row_stride, s.kv_batch_stride);
  }
};

Backward run_backward(const Inputs& in, const Forward& f, Precision precision,
                      const AttentionOptions& options = {}) {
  Backward g;
  g.dq_buf.assign(in.q_buf.size(), std::numeric_limits<float>::quiet_NaN());
  g.dkv_buf.assign(in.kv_buf.size(), std::numeric_limits<float>::quiet_NaN());
  MatmulEngine engine;
  attention_backward(g.dq(), g.dk(), g.dv(in.s), in.d_out.data(), in.q(), in.k(), in.v(),
                     f.out.data(), f.lse.data(), in.s, precision, engine, options);
  return g;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - b| over entries, relative to `scale`.
template <class A>
double error_relative_to(const A& a, const std::vector<double>& b, double scale) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m / std::max(scale, 1e-30);
}

// lse: -inf exactly where the reference has -inf (queries that see no key), and within
// `tolerance` of the finite values' scale elsewhere.
void expect_lse_matches(const std::vector<float>& got, const std::vector<double>& ref,
                        double tolerance) {
  double max_diff = 0, max_ref = 0;
  int64_t wrong_inf = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == kNegInf) {
      wrong_inf += got[i] != -std::numeric_limits<float>::infinity();
      continue;
    }
    max_diff = std::max(max_diff, std::fabs(got[i] - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  EXPECT_EQ(wrong_inf, 0) << "queries that see no key must have lse -inf, and only they";
  EXPECT_LE(max_diff, tolerance * std::max(max_ref, 1.0));
}

// Every element of the outputs of queries that see no key is exactly 0.
int64_t nonzero_outputs_of_blind_queries(const std::vector<float>& out, const AttentionShape& s) {
  int64_t nonzero = 0;
  const int64_t width = s.q_heads * s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.q_len; ++i)
      if (visible_keys(s, i) == 0)
        for (int64_t x = 0; x < width; ++x) nonzero += out[(b * s.q_len + i) * width + x] != 0.0f;
  return nonzero;
}

// The general cases: queries that end inside, before or after the keys; queries of which some or
// all see no key; no mask; lengths below, between and above the 64-row tiles; GQA 1, 2, 4; head
// dims 16, 24 (not a multiple of 16 lanes) and 64; padded rows and a larger KV cache.
std::vector<Case> general_cases() {
  std::vector<Case> cases;
  auto add = [&](int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                 std::optional<int64_t> q_offset, int64_t k_offset, AttentionMask mask,
                 int64_t row_pad = 0, int64_t kv_capacity = 0) {
    Case c;
    c.B = B, c.Tq = Tq, c.Tk = Tk, c.Hq = Hq, c.Hkv = Hkv, c.D = D;
    c.q_offset = q_offset, c.k_offset = k_offset, c.mask = mask;
    c.row_pad = row_pad, c.kv_capacity = kv_capacity;
    cases.push_back(c);
  };
  const AttentionMask causal = AttentionMask::causal, none = AttentionMask::none;
  add(2, 50, 130, 4, 2, 64, 100, 0, causal);            // queries end 20 past the last key
  add(1, 70, 40, 2, 1, 16, 0, 30, causal, 3);           // the first 30 queries see nothing
  add(1, 100, 65, 4, 4, 24, 10, 200, causal);           // no query sees any key
  add(2, 33, 150, 4, 1, 64, 7, 3, none, 0, 160);        // no mask, KV cache with spare rows
  add(1, 130, 70, 2, 2, 16, 0, 0, none, 5);             // no mask, more queries than keys
  add(1, 1, 200, 4, 2, 64, 500, 128, causal, 0, 256);   // one query after every key
  add(1, 129, 129, 2, 1, 24, 64, 0, causal);            // equal lengths, shifted 64
  add(2, 80, 100, 2, 2, 16, std::nullopt, 40, causal);  // the default rule with a key offset
  return cases;
}

TEST(AttentionGeneralForward, MatchesNaiveReference) {
  uint64_t seed = 1000;
  for (const Case& c : general_cases()) {
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c, seed += 10);
    const Reference ref = naive_attention(in, false);
    const Forward f = run_forward(in, Precision::fp32);
    EXPECT_LE(error_relative_to(f.out, ref.out, std::max(max_abs(ref.out), 1.0)), kFp32Tolerance);
    expect_lse_matches(f.lse, ref.lse, kFp32Tolerance);
    EXPECT_EQ(nonzero_outputs_of_blind_queries(f.out, in.s), 0);
  }
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

std::vector<lattice::bf16> rounded(const std::vector<float>& x) {
  return testing::rounded_to_bf16(x);
}

TEST(AttentionGeneralForward, Bf16WithinToleranceAndBf16InputsAgreeBitForBit) {
  for_each_bf16_path([](const AttentionOptions& options) {
    uint64_t seed = 2000;
    for (const Case& c : general_cases()) {
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c, seed += 10);
      const Reference ref = naive_attention(in, false);
      const Forward f = run_forward(in, Precision::bf16, options);
      EXPECT_LE(error_relative_to(f.out, ref.out, std::max(max_abs(ref.out), 1.0)), kBf16Tolerance);
      expect_lse_matches(f.lse, ref.lse, kBf16Tolerance);
      EXPECT_EQ(nonzero_outputs_of_blind_queries(f.out, in.s), 0);
      // attention_forward_bf16 on the rounded inputs: the same bits.
      const std::vector<lattice::bf16> q16 = rounded(in.q_buf), kv16 = rounded(in.kv_buf);
      Forward g;
      g.out.assign(f.out.size(), -1.0f);
      g.lse.assign(f.lse.size(), -1.0f);
      attention_forward_bf16(g.out.data(), g.lse.data(), q16.data(), kv16.data(),
                             kv16.data() + in.s.kv_heads * in.s.head_dim, in.s, options);
      EXPECT_EQ(g.out, f.out);
      EXPECT_EQ(g.lse, f.lse);
    }
  });
}

// Gradients against the reference, relative to the largest of the three (a case where no query
// sees a key has all-zero gradients: then they must be exactly zero); every element the gradients
// own is written, padding keeps its NaN.
void expect_gradients_match(const Backward& g, const Reference& ref, const AttentionShape& s,
                            double tolerance) {
  const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  if (scale == 0.0) {
    EXPECT_EQ(max_abs(g.dense_dq(s)), 0.0);
    EXPECT_EQ(max_abs(g.dense_dk(s)), 0.0);
    EXPECT_EQ(max_abs(g.dense_dv(s)), 0.0);
  } else {
    EXPECT_LE(error_relative_to(g.dense_dq(s), ref.dq, scale), tolerance);
    EXPECT_LE(error_relative_to(g.dense_dk(s), ref.dk, scale), tolerance);
    EXPECT_LE(error_relative_to(g.dense_dv(s), ref.dv, scale), tolerance);
  }
  int64_t written = 0;
  for (float x : g.dq_buf) written += !std::isnan(x);
  for (float x : g.dkv_buf) written += !std::isnan(x);
  EXPECT_EQ(written, s.batch * (s.q_len * s.q_heads + 2 * s.kv_len * s.kv_heads) * s.head_dim);
}

// dq rows of queries that see no key and dk, dv rows of keys no query sees are exactly 0.
void expect_blind_rows_zero(const Backward& g, const AttentionShape& s) {
  const std::vector<double> dq = g.dense_dq(s), dk = g.dense_dk(s), dv = g.dense_dv(s);
  const int64_t q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  int64_t nonzero = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.q_len; ++i)
      if (visible_keys(s, i) == 0)
        for (int64_t x = 0; x < q_width; ++x) nonzero += dq[(b * s.q_len + i) * q_width + x] != 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      bool seen = false;
      for (int64_t i = 0; i < s.q_len; ++i) seen = seen || j < visible_keys(s, i);
      if (seen) continue;
      for (int64_t x = 0; x < kv_width; ++x)
        nonzero += (dk[(b * s.kv_len + j) * kv_width + x] != 0) +
                   (dv[(b * s.kv_len + j) * kv_width + x] != 0);
    }
  }
  EXPECT_EQ(nonzero, 0);
}

TEST(AttentionGeneralBackward, MatchesNaiveAnalyticGradient) {
  uint64_t seed = 3000;
  for (const Case& c : general_cases()) {
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c, seed += 10);
    const Reference ref = naive_attention(in, true);
    const Forward f = run_forward(in, Precision::fp32);
    const Backward g = run_backward(in, f, Precision::fp32);
    expect_gradients_match(g, ref, in.s, kFp32Tolerance);
    expect_blind_rows_zero(g, in.s);
  }
}

TEST(AttentionGeneralBackward, Bf16WithinToleranceAndBf16RowsAreTheFp32OnesRounded) {
  for_each_bf16_path([](const AttentionOptions& options) {
    uint64_t seed = 4000;
    for (const Case& c : general_cases()) {
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c, seed += 10);
      const Reference ref = naive_attention(in, true);
      const Forward f = run_forward(in, Precision::bf16, options);
      const Backward g = run_backward(in, f, Precision::bf16, options);
      expect_gradients_match(g, ref, in.s, kBf16Tolerance);
      expect_blind_rows_zero(g, in.s);
      // attention_backward_bf16 on the rounded inputs: its rows are these gradients rounded.
      const std::vector<lattice::bf16> q16 = rounded(in.q_buf), kv16 = rounded(in.kv_buf);
      const lattice::bf16 sentinel{0x7fc1};
      std::vector<lattice::bf16> dq16(q16.size(), sentinel), dkv16(kv16.size(), sentinel);
      AttentionGradientsBf16 grads;
      grads.dq = dq16.data();
      grads.dk = dkv16.data();
      grads.dv = dkv16.data() + in.s.kv_heads * in.s.head_dim;
      attention_backward_bf16(grads, in.d_out.data(), q16.data(), kv16.data(),
                              kv16.data() + in.s.kv_heads * in.s.head_dim, f.out.data(),
                              f.lse.data(), in.s, options);
      int64_t mismatches = 0;
      for (size_t i = 0; i < dq16.size(); ++i)
        mismatches += std::isnan(g.dq_buf[i]) ? dq16[i].bits != sentinel.bits
                                              : dq16[i].bits != to_bf16(g.dq_buf[i]).bits;
      for (size_t i = 0; i < dkv16.size(); ++i)
        mismatches += std::isnan(g.dkv_buf[i]) ? dkv16[i].bits != sentinel.bits
                                               : dkv16[i].bits != to_bf16(g.dkv_buf[i]).bits;
      EXPECT_EQ(mismatches, 0);
    }
  });
}

// The keys of `in` split at `bounds` (first key of each block, then Tk): each block's shape is the
// full one with its kv_len, its first position as k_offset and the full call's query positions.
struct KeyBlock {
  int64_t first = 0, length = 0;
};

std::vector<KeyBlock> key_blocks(const std::vector<int64_t>& bounds) {
  std::vector<KeyBlock> blocks;
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    blocks.push_back({bounds[i], bounds[i + 1] - bounds[i]});
  return blocks;
}

AttentionShape block_shape(const AttentionShape& full, const KeyBlock& block) {
  AttentionShape s = full;
  s.q_offset = full.query_offset();
  s.k_offset = full.k_offset + block.first;
  s.kv_len = block.length;
  return s;
}

// Forward over the key blocks, merged: out starts at 0 and lse at -inf.
Forward merged_forward(const Inputs& in, const std::vector<KeyBlock>& blocks, Precision precision,
                       const AttentionOptions& options) {
  Forward merged;
  merged.out.assign(static_cast<size_t>(in.out_size()), 0.0f);
  merged.lse.assign(static_cast<size_t>(in.lse_size()), -std::numeric_limits<float>::infinity());
  Forward part = merged;
  MatmulEngine engine;
  for (const KeyBlock& block : blocks) {
    const AttentionShape s = block_shape(in.s, block);
    const int64_t row = block.first * in.s.k_row_stride;
    attention_forward(part.out.data(), part.lse.data(), in.q(), in.k() + row, in.v() + row, s,
                      precision, engine, options);
    attention_merge_partial(merged.out.data(), merged.lse.data(), part.out.data(), part.lse.data(),
                            s.batch, s.q_len, s.q_heads, s.head_dim);
  }
  return merged;
}

// Cases split into key blocks: aligned and unaligned to the 64/128-key tiles, a block no query
// sees at all, a block some queries do not see; causal and no mask.
struct BlockCase {
  Case c;
  std::vector<int64_t> bounds;
};

std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> cases;
  Case training;  // the default rule: queries are the last 150 of 200 key positions
  training.B = 2, training.Tq = 150, training.Tk = 200, training.Hq = 4, training.Hkv = 2;
  training.D = 32;
  cases.push_back({training, {0, 64, 150, 200}});
  Case ring = training;  // queries at 1000..1149, keys at 900..1099 (a future block at the end)
  ring.q_offset = 1000, ring.k_offset = 900, ring.Tk = 260, ring.D = 24, ring.Hkv = 1;
  cases.push_back({ring, {0, 128, 250, 260}});
  Case unmasked = training;
  unmasked.mask = AttentionMask::none, unmasked.Tq = 70, unmasked.row_pad = 3;
  cases.push_back({unmasked, {0, 77, 100, 200}});
  return cases;
}

TEST(AttentionKeyBlocks, MergedForwardEqualsFullForward) {
  // Tolerance 4e-6 relative to the outputs' scale (lse: to max(|lse|, 1)): each block computes
  // its part as the full call would, and the merge rescales and adds them in double, so only the
  // changed order of the fp32 sums differs, a few units of fp32 rounding (2^-23 = 1.2e-7 each;
  // about 5e-7 seen on an AMX host); any masking or offset mistake is of order 1.
  uint64_t seed = 5000;
  for (const BlockCase& bc : block_cases()) {
    SCOPED_TRACE(bc.c.name());
    const Inputs in = make_inputs(bc.c, seed += 10);
    const Forward full = run_forward(in, Precision::fp32);
    const Forward merged = merged_forward(in, key_blocks(bc.bounds), Precision::fp32, {});
    std::vector<double> full_out(full.out.begin(), full.out.end());
    std::vector<double> full_lse(full.lse.begin(), full.lse.end());
    EXPECT_LE(error_relative_to(merged.out, full_out, max_abs(full_out)), 4e-6);
    expect_lse_matches(merged.lse, full_lse, 4e-6);
    // And the merged result against the naive reference, as the full one is.
    const Reference ref = naive_attention(in, false);
    EXPECT_LE(error_relative_to(merged.out, ref.out, max_abs(ref.out)), kFp32Tolerance);
  }
}

TEST(AttentionKeyBlocks, MergeHandlesPartsThatSawNoKey) {
  // A part with lse -inf changes nothing (bit for bit); a running result with lse -inf takes the
  // part as it is; two equal parts merge to the same output with lse + log 2.
  const int64_t B = 1, T = 3, H = 2, D = 4;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> out0 = random_vector(B * T * H * D, 1),
                           part = random_vector(B * T * H * D, 2);
  const std::vector<float> lse0 = {0.5f, -inf, 2.0f, 1.0f, -inf, 3.0f};
  const std::vector<float> part_lse = {-inf, 1.5f, 2.0f, -inf, -inf, 3.0f};
  std::vector<float> out = out0, lse = lse0;
  attention_merge_partial(out.data(), lse.data(), part.data(), part_lse.data(), B, T, H, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t l = static_cast<size_t>(h * T + t), row = static_cast<size_t>((t * H + h) * D);
      SCOPED_TRACE(::testing::Message() << "t=" << t << " h=" << h);
      const std::vector<float> got(out.begin() + row, out.begin() + row + D);
      const std::vector<float> was(out0.begin() + row, out0.begin() + row + D);
      const std::vector<float> p(part.begin() + row, part.begin() + row + D);
      if (part_lse[l] == -inf) {
        EXPECT_EQ(got, was);
        EXPECT_EQ(lse[l], lse0[l]);
      } else if (lse0[l] == -inf) {
        EXPECT_EQ(got, p);
        EXPECT_EQ(lse[l], part_lse[l]);
      } else {  // equal weights: the mean, lse + log 2
        for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(got[d], 0.5f * (was[d] + p[d]));
        EXPECT_FLOAT_EQ(lse[l], lse0[l] + std::log(2.0f));
      }
    }
  // Both -inf (t = 1, h = 1): the output stays as it was and lse -inf.
  EXPECT_EQ(lse[static_cast<size_t>(1 * T + 1)], -inf);
}

// Backward block by block: the final (full) out and lse, dq accumulated from zero, each block's
// dk and dv written into its rows.
Backward blockwise_backward(const Inputs& in, const Forward& final_result,
                            const std::vector<KeyBlock>& blocks, Precision precision,
                            AttentionOptions options) {
  Backward g;
  g.dq_buf.assign(in.q_buf.size(), std::numeric_limits<float>::quiet_NaN());
  g.dkv_buf.assign(in.kv_buf.size(), std::numeric_limits<float>::quiet_NaN());
  // dq's own elements zeroed (accumulate_dq adds to them), padding left NaN.
  for (int64_t b = 0; b < in.s.batch; ++b)
    for (int64_t t = 0; t < in.s.q_len; ++t)
      std::fill_n(g.dq() + b * in.s.q_batch_stride + t * in.s.q_row_stride,
                  in.s.q_heads * in.s.head_dim, 0.0f);
  options.accumulate_dq = true;
  MatmulEngine engine;
  for (const KeyBlock& block : blocks) {
    const AttentionShape s = block_shape(in.s, block);
    const int64_t row = block.first * in.s.k_row_stride;
    attention_backward(g.dq(), g.dk() + row, g.dv(in.s) + row, in.d_out.data(), in.q(),
                       in.k() + row, in.v() + row, final_result.out.data(), final_result.lse.data(),
                       s, precision, engine, options);
  }
  return g;
}

TEST(AttentionKeyBlocks, BlockBackwardsSumToTheFullBackward) {
  // Each block recomputes its probabilities from the final lse exactly as the full backward does
  // (in bf16 too: the same rounding of the same values), so dk and dv of a block and each block's
  // dq contribution are the full call's sums over the same terms; only dq's fp32 sum over the
  // blocks runs in another order (about 5e-7 seen on an AMX host; dk and dv came out bit-equal).
  // Tolerance 4e-6 of the largest gradient, for fp32 and bf16 alike.
  uint64_t seed = 6000;
  for (const BlockCase& bc : block_cases()) {
    SCOPED_TRACE(bc.c.name());
    const Inputs in = make_inputs(bc.c, seed += 10);
    const auto blocks = key_blocks(bc.bounds);
    const auto check = [&](Precision precision, const AttentionOptions& options) {
      const Forward full = run_forward(in, precision, options);
      const Backward expected = run_backward(in, full, precision, options);
      const Backward got = blockwise_backward(in, full, blocks, precision, options);
      const std::vector<double> dq = expected.dense_dq(in.s), dk = expected.dense_dk(in.s),
                                dv = expected.dense_dv(in.s);
      const double scale = std::max({max_abs(dq), max_abs(dk), max_abs(dv)});
      EXPECT_LE(error_relative_to(got.dense_dq(in.s), dq, scale), 4e-6);
      EXPECT_LE(error_relative_to(got.dense_dk(in.s), dk, scale), 4e-6);
      EXPECT_LE(error_relative_to(got.dense_dv(in.s), dv, scale), 4e-6);
      // Padding untouched, every gradient element written.
      int64_t nan_written = 0;
      for (size_t i = 0; i < got.dq_buf.size(); ++i)
        nan_written += std::isnan(got.dq_buf[i]) != std::isnan(expected.dq_buf[i]);
      for (size_t i = 0; i < got.dkv_buf.size(); ++i)
        nan_written += std::isnan(got.dkv_buf[i]) != std::isnan(expected.dkv_buf[i]);
      EXPECT_EQ(nan_written, 0);
    };
    {
      SCOPED_TRACE("fp32");
      check(Precision::fp32, {});
    }
    for_each_bf16_path([&](const AttentionOptions& options) { check(Precision::bf16, options); });
    // And the fp32 blocks against the naive reference.
    const Reference ref = naive_attention(in, true);
    const Forward full = run_forward(in, Precision::fp32);
    const Backward got = blockwise_backward(in, full, blocks, Precision::fp32, {});
    expect_gradients_match(got, ref, in.s, kFp32Tolerance);
  }
}

TEST(AttentionGeneralBackward, MatchesFiniteDifferences) {
  // L = sum_i w_i out_i of the kernel itself (fp32), differentiated numerically in q, k and v.
  // Step 1e-2 on unit-scale inputs: truncation error ~step^2 = 1e-4 relative, fp32 rounding noise
  // in L ~1e-7 |L| / step ~ 1e-5; the 2e-3 bound covers both and still catches any wrong term.
  // Queries 0 and 1 (positions 0, 1) see no key (keys start at 2): their gradient is 0.
  Case causal;
  causal.Tq = 7, causal.Tk = 9, causal.Hq = 4, causal.Hkv = 2, causal.D = 8;
  causal.q_offset = 0, causal.k_offset = 2, causal.row_pad = 1;
  Case unmasked = causal;
  unmasked.mask = AttentionMask::none, unmasked.Tq = 5;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);  // ~2000 tiny calls
  uint64_t seed = 7000;
  for (const Case& c : {causal, unmasked}) {
    SCOPED_TRACE(c.name());
    Inputs in = make_inputs(c, seed += 10);
    const Forward f = run_forward(in, Precision::fp32);
    const Backward g = run_backward(in, f, Precision::fp32);
    const auto loss = [&] {
      return testing::weighted_sum(run_forward(in, Precision::fp32).out, in.d_out);
    };
    const std::vector<double> numeric_q = testing::numerical_gradient(
        loss, in.q_buf.data(), static_cast<int64_t>(in.q_buf.size()), 1e-2f);
    const std::vector<double> numeric_kv = testing::numerical_gradient(
        loss, in.kv_buf.data(), static_cast<int64_t>(in.kv_buf.size()), 1e-2f);
    // Padding is not an input (numerically 0, analytically NaN): compare the gradients' elements.
    std::vector<double> analytic_q, numerical_q, analytic_kv, numerical_kv;
    for (size_t i = 0; i < g.dq_buf.size(); ++i)
      if (!std::isnan(g.dq_buf[i]))
        analytic_q.push_back(g.dq_buf[i]), numerical_q.push_back(numeric_q[i]);
    for (size_t i = 0; i < g.dkv_buf.size(); ++i)
      if (!std::isnan(g.dkv_buf[i]))
        analytic_kv.push_back(g.dkv_buf[i]), numerical_kv.push_back(numeric_kv[i]);
    EXPECT_LT(max_relative_error(analytic_q, numerical_q), 2e-3);
    EXPECT_LT(max_relative_error(analytic_kv, numerical_kv), 2e-3);
  }
  omp_set_num_threads(saved_threads);
}

TEST(AttentionGeneral, DefaultPositionsEqualTheExplicitOldRuleBitForBit) {
  // Without q_offset, query i sits at kv_len - q_len + i and key j at j (the rule every existing
  // caller relies on): the same call with those offsets spelled out, or with both moved by the
  // same amount, gives the same bits in every precision and path.
  Case training;
  training.B = 2, training.Tq = 100, training.Tk = 100, training.Hq = 4, training.Hkv = 2;
  training.D = 64;
  Case cache = training;  // a KV-cache chunk: forward only
  cache.Tq = 70, cache.Tk = 150, cache.kv_capacity = 160;
  uint64_t seed = 8000;
  for (const Case& c : {training, cache}) {
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c, seed += 10);
    Inputs explicit_in = in, moved_in = in;
    explicit_in.s.q_offset = c.Tk - c.Tq;
    moved_in.s.q_offset = 1000 + c.Tk - c.Tq;
    moved_in.s.k_offset = 1000;
    const auto check = [&](Precision precision, const AttentionOptions& options) {
      const Forward f = run_forward(in, precision, options);
      for (const Inputs* other : {&explicit_in, &moved_in}) {
        const Forward o = run_forward(*other, precision, options);
        EXPECT_EQ(o.out, f.out);
        EXPECT_EQ(o.lse, f.lse);
        const Backward g = run_backward(in, f, precision, options);
        const Backward h = run_backward(*other, o, precision, options);
        EXPECT_EQ(std::memcmp(g.dq_buf.data(), h.dq_buf.data(), g.dq_buf.size() * sizeof(float)),
                  0);
        EXPECT_EQ(std::memcmp(g.dkv_buf.data(), h.dkv_buf.data(), g.dkv_buf.size() * sizeof(float)),
                  0);
      }
    };
    check(Precision::fp32, {});
    for_each_bf16_path([&](const AttentionOptions& options) { check(Precision::bf16, options); });
  }
}

TEST(AttentionGeneral, ResultsAreBitwiseIndependentOfThreadCount) {
  // General positions and both masks keep the kernels' per-row and per-(batch, kv head) order.
  Case c;
  c.B = 2, c.Tq = 90, c.Tk = 170, c.Hq = 4, c.Hkv = 2, c.D = 32, c.q_offset = 40, c.k_offset = 0;
  const int saved_threads = omp_get_max_threads();
  for (const AttentionMask mask : {AttentionMask::causal, AttentionMask::none}) {
    c.mask = mask;
    const Inputs in = make_inputs(c, 9000);
    for (const char* path : {"fp32", "bf16", "bf16-portable"}) {
      SCOPED_TRACE(::testing::Message() << c.name() << " " << path);
      const Precision precision = path[0] == 'f' ? Precision::fp32 : Precision::bf16;
      AttentionOptions options;
      options.allow_amx = std::string(path) != "bf16-portable";
      std::vector<Forward> forwards;
      std::vector<Backward> backwards;
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        forwards.push_back(run_forward(in, precision, options));
        backwards.push_back(run_backward(in, forwards.back(), precision, options));
      }
      EXPECT_EQ(forwards[0].out, forwards[1].out);
      EXPECT_EQ(std::memcmp(forwards[0].lse.data(), forwards[1].lse.data(),
                            forwards[0].lse.size() * sizeof(float)),
                0);
      for (const auto member : {&Backward::dq_buf, &Backward::dkv_buf}) {
        const std::vector<float>& a = backwards[0].*member;
        const std::vector<float>& b = backwards[1].*member;
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

// Runs f and expects a lattice::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a lattice::Error";
  } catch (const Error& e) {
    for (const char* part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' missing from: " << e.what();
  }
}

TEST(AttentionGeneral, RejectsImpossibleShapesWithClearErrors) {
  std::vector<float> buf(1 << 14, 0.0f);
  float* p = buf.data();
  MatmulEngine engine;
  const auto forward = [&](const AttentionShape& s) {
    return [&, s] { attention_forward(p, p, p, p, p, s, Precision::fp32, engine); };
  };
  const auto backward = [&](const AttentionShape& s, AttentionOptions options = {}) {
    return [&, s, options] {
      attention_backward(p, p, p, p, p, p, p, p, p, s, Precision::fp32, engine, options);
    };
  };
  const AttentionShape good = AttentionShape::contiguous(1, 4, 6, 2, 2, 8);
  AttentionShape s = good;
  s.q_len = -1;
  expect_error(forward(s), {"attention_forward", "q_len (-1)", "positive"});
  s = good;
  s.kv_len = 0;
  expect_error(backward(s), {"attention_backward", "kv_len (0)", "positive"});
  s = good;
  s.head_dim = -8;
  expect_error(forward(s), {"head_dim (-8)"});
  s = AttentionShape::contiguous(1, 4, 4, 3, 2, 8);
  expect_error(forward(s), {"q_heads (3)", "multiple of kv_heads (2)"});
  s = good;
  s.k_offset = -5;
  expect_error(forward(s), {"k_offset (-5)"});
  s = good;
  s.q_offset = -1;
  expect_error(backward(s), {"q_offset (-1)"});
  s = good;
  s.q_offset = int64_t{1} << 60;
  expect_error(forward(s), {"q_offset"});
  s = AttentionShape::contiguous(1, 6, 4, 2, 2, 8);  // default rule with fewer keys than queries
  expect_error(forward(s), {"kv_len (4)", "q_len (6)", "set q_offset"});
  s.q_offset = 0;  // with explicit positions that shape is fine
  EXPECT_NO_THROW(forward(s)());
  s = good;
  s.mask = static_cast<AttentionMask>(7);
  expect_error(forward(s), {"mask"});
  s = good;
  s.q_row_stride = 3;
  expect_error(forward(s), {"q_row_stride"});
  // accumulate_dq needs fp32 dq.
  std::vector<lattice::bf16> b16(1 << 12);
  AttentionGradientsBf16 grads{b16.data(), b16.data(), b16.data()};
  AttentionOptions accumulate;
  accumulate.accumulate_dq = true;
  expect_error(
      [&] {
        attention_backward_bf16(grads, p, b16.data(), b16.data(), b16.data(), p, p, good,
                                accumulate);
      },
      {"attention_backward_bf16", "accumulate_dq"});
  expect_error([&] { attention_merge_partial(p, p, p, p, 1, 0, 2, 8); },
               {"attention_merge_partial", "q_len (0)"});
}

}  // namespace
}  // namespace lattice::kernels
