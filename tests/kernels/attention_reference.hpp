// Shared by the general-attention tests (test_attention_general.cpp, test_attention_blocks.cpp): a
// case description (lengths, heads, positions, mask, padded rows), its random inputs, a naive
// double-precision reference that materialises the masked softmax and its analytic gradient, the
// kernel calls, and the comparisons with their tolerances.
#pragma once

#include <gtest/gtest.h>

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

namespace lattice::kernels::attention_testing {

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
  int64_t Dv = 0;      // value head width (0: D)
  int64_t window = 0;  // sliding window (0: none)
  std::optional<int64_t> q_offset;
  int64_t k_offset = 0;
  AttentionMask mask = AttentionMask::causal;
  int64_t row_pad = 0, kv_capacity = 0;

  AttentionShape shape() const {
    AttentionShape s;
    s.batch = B, s.q_len = Tq, s.kv_len = Tk, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = D;
    s.v_head_dim = Dv;
    s.window = window;
    s.q_row_stride = Hq * D + row_pad;
    s.q_batch_stride = Tq * s.q_row_stride;
    s.k_row_stride = s.v_row_stride = Hkv * (D + s.value_dim()) + row_pad;
    s.kv_batch_stride = std::max(kv_capacity, Tk) * s.k_row_stride;
    s.q_offset = q_offset;
    s.k_offset = k_offset;
    s.mask = mask;
    return s;
  }
  std::string name() const {
    return "B=" + std::to_string(B) + " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) +
           " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
           (Dv > 0 ? " Dv=" + std::to_string(Dv) : "") +
           (window > 0 ? " window=" + std::to_string(window) : "") +
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
  int64_t out_size() const { return s.batch * s.q_len * s.q_heads * s.value_dim(); }
  int64_t lse_size() const { return s.batch * s.q_heads * s.q_len; }
};

inline Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.s = c.shape();
  in.q_buf = random_vector(in.s.batch * in.s.q_batch_stride, seed);
  in.kv_buf = random_vector(in.s.batch * in.s.kv_batch_stride, seed + 1);
  in.d_out = random_vector(in.out_size(), seed + 2);
  return in;
}

// Dense [B, T, width] doubles of strided rows.
inline std::vector<double> gather(const float* base, int64_t B, int64_t T, int64_t width,
                                  int64_t row_stride, int64_t batch_stride) {
  std::vector<double> out(static_cast<size_t>(B * T * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; ++i)
        out[static_cast<size_t>((b * T + t) * width + i)] =
            base[b * batch_stride + t * row_stride + i];
  return out;
}

// Keys query i sees: first_visible_key(s, i) <= j < visible_keys(s, i) (the mask, positions and
// window, written out independently of the kernel's own rule).
inline int64_t visible_keys(const AttentionShape& s, int64_t i) {
  if (s.mask == AttentionMask::none) return s.kv_len;
  const int64_t q_position =
      (s.q_offset ? *s.q_offset : s.k_offset + s.kv_len - s.q_len) + i;  // absolute
  // Key j at absolute position k_offset + j is seen when k_offset + j <= q_position.
  return std::clamp<int64_t>(q_position - s.k_offset + 1, 0, s.kv_len);
}
inline int64_t first_visible_key(const AttentionShape& s, int64_t i) {
  if (s.window == 0) return 0;
  const int64_t q_position = (s.q_offset ? *s.q_offset : s.k_offset + s.kv_len - s.q_len) + i;
  // Key j is inside the window when q_position - (k_offset + j) < window.
  return std::clamp<int64_t>(q_position - s.window + 1 - s.k_offset, 0, s.kv_len);
}
inline int64_t keys_seen(const AttentionShape& s, int64_t i) {
  return std::max<int64_t>(visible_keys(s, i) - first_visible_key(s, i), 0);
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // dense [B, T, H*D] and [B, Hq, Tq]
};

// Naive masked softmax attention in double, materialising P; with d_out, the analytic gradient
// dS = P * (dP - rowsum(P * dP)). A query that sees no key: out 0, lse -inf, no gradient.
// On dense [B, T, H*D] q, k, v; d_out (dense like out) null for the forward only.
inline Reference naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v, const AttentionShape& s,
                                 const std::vector<float>* d_out) {
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len, Hq = s.q_heads, Hkv = s.kv_heads,
                D = s.head_dim, Dv = s.value_dim(), group = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(static_cast<size_t>(B * Tq * Hq * Dv), 0.0);
  r.lse.assign(static_cast<size_t>(B * Hq * Tq), kNegInf);
  r.dq.assign(static_cast<size_t>(B * Tq * Hq * D), 0.0);
  r.dk.assign(static_cast<size_t>(B * Tk * Hkv * D), 0.0);
  r.dv.assign(static_cast<size_t>(B * Tk * Hkv * Dv), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tq + t) * Hq + h) * D; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tk + t) * Hkv + h) * D; };
  auto oi = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tq + t) * Hq + h) * Dv; };
  auto vi = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tk + t) * Hkv + h) * Dv; };
  std::vector<double> p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t kvh = h / group, seen = visible_keys(s, i), first = first_visible_key(s, i);
        if (seen <= first) continue;
        double max_score = kNegInf;
        for (int64_t j = first; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[qi(b, i, h) + d] * k[ki(b, j, kvh) + d];
          p[j] = dot * scale;
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0;
        for (int64_t j = first; j < seen; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        for (int64_t j = first; j < seen; ++j) p[j] /= sum;
        r.lse[(b * Hq + h) * Tq + i] = max_score + std::log(sum);
        for (int64_t j = first; j < seen; ++j)
          for (int64_t d = 0; d < Dv; ++d) r.out[oi(b, i, h) + d] += p[j] * v[vi(b, j, kvh) + d];
        if (d_out == nullptr) continue;
        const float* g = d_out->data() + oi(b, i, h);
        double delta = 0;
        for (int64_t j = first; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < Dv; ++d) dot += g[d] * v[vi(b, j, kvh) + d];
          dp[j] = dot;
          delta += p[j] * dot;
        }
        for (int64_t j = first; j < seen; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, i, h) + d] += ds * k[ki(b, j, kvh) + d];
            r.dk[ki(b, j, kvh) + d] += ds * q[qi(b, i, h) + d];
          }
          for (int64_t d = 0; d < Dv; ++d) r.dv[vi(b, j, kvh) + d] += p[j] * g[d];
        }
      }
  return r;
}

inline Reference naive_attention(const Inputs& in, bool with_backward) {
  const AttentionShape& s = in.s;
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len;
  const int64_t q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const int64_t v_width = s.kv_heads * s.value_dim();
  return naive_attention(gather(in.q(), B, Tq, q_width, s.q_row_stride, s.q_batch_stride),
                         gather(in.k(), B, Tk, kv_width, s.k_row_stride, s.kv_batch_stride),
                         gather(in.v(), B, Tk, v_width, s.v_row_stride, s.kv_batch_stride), s,
                         with_backward ? &in.d_out : nullptr);
}

struct Forward {
  std::vector<float> out, lse;
};

inline Forward run_forward(const Inputs& in, Precision precision,
                           const AttentionOptions& options = {}) {
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
                  s.kv_heads * s.value_dim(), s.v_row_stride, s.kv_batch_stride);
  }
};

inline Backward run_backward(const Inputs& in, const Forward& f, Precision precision,
                             const AttentionOptions& options = {}) {
  Backward g;
  g.dq_buf.assign(in.q_buf.size(), std::numeric_limits<float>::quiet_NaN());
  g.dkv_buf.assign(in.kv_buf.size(), std::numeric_limits<float>::quiet_NaN());
  MatmulEngine engine;
  attention_backward(g.dq(), g.dk(), g.dv(in.s), in.d_out.data(), in.q(), in.k(), in.v(),
                     f.out.data(), f.lse.data(), in.s, precision, engine, options);
  return g;
}

inline double max_abs(const std::vector<double>& x) {
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
inline void expect_lse_matches(const std::vector<float>& got, const std::vector<double>& ref,
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
inline int64_t nonzero_outputs_of_blind_queries(const std::vector<float>& out,
                                                const AttentionShape& s) {
  int64_t nonzero = 0;
  const int64_t width = s.q_heads * s.value_dim();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.q_len; ++i)
      if (keys_seen(s, i) == 0)
        for (int64_t x = 0; x < width; ++x) nonzero += out[(b * s.q_len + i) * width + x] != 0.0f;
  return nonzero;
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

inline std::vector<lattice::bf16> rounded(const std::vector<float>& x) {
  return testing::rounded_to_bf16(x);
}

// Gradients against the reference, relative to the largest of the three (a case where no query
// sees a key has all-zero gradients: then they must be exactly zero); every element the gradients
// own is written, padding keeps its NaN.
inline void expect_gradients_match(const Backward& g, const Reference& ref, const AttentionShape& s,
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
  EXPECT_EQ(written, s.batch * (s.q_len * s.q_heads * s.head_dim +
                                s.kv_len * s.kv_heads * (s.head_dim + s.value_dim())));
}

}  // namespace lattice::kernels::attention_testing
