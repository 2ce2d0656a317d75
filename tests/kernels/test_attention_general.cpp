// Tests of general attention: query and key lengths that differ, explicit query and key positions,
// the causal and unmasked masks, in fp32 and both bf16 paths (AMX where the CPU has it, and
// portable), against the naive double-precision reference of attention_reference.hpp and against
// finite differences; value heads of their own width and sliding windows; the default positions
// against the explicit old rule; thread-count independence; and clear errors for impossible
// shapes.
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

#include "attention_reference.hpp"
#include "gradcheck.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"

namespace lattice::kernels {
namespace {

using namespace attention_testing;
using testing::max_relative_error;
using testing::random_vector;

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
  // Value heads narrower and wider than the query-key heads (DeepSeek's MLA: 192 / 128; here
  // scaled down), with GQA and padded rows.
  add(2, 70, 70, 4, 2, 48, std::nullopt, 0, causal, 3);
  cases.back().Dv = 32;
  add(1, 40, 90, 2, 1, 16, 60, 0, none);
  cases.back().Dv = 40;
  // Sliding windows (Mistral's): narrower than a tile, wider than one, at a shifted block of keys
  // (one ring step), and with a narrower value head too.
  add(2, 150, 150, 4, 2, 32, std::nullopt, 0, causal);
  cases.back().window = 17;
  add(1, 200, 200, 2, 1, 24, std::nullopt, 0, causal, 2);
  cases.back().window = 90;
  add(1, 100, 80, 4, 2, 16, 150, 40, causal);  // keys 40..119, queries 150..249
  cases.back().window = 64;
  add(2, 130, 130, 4, 4, 32, std::nullopt, 0, causal);
  cases.back().window = 40, cases.back().Dv = 16;
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
      if (c.window > 0 || c.Dv > 0) {
        // These shapes run on the portable path whatever the options: the same bits either way.
        AttentionOptions portable = options;
        portable.allow_amx = false;
        EXPECT_EQ(run_forward(in, Precision::bf16, portable).out, f.out);
      }
      EXPECT_EQ(g.out, f.out);
      EXPECT_EQ(g.lse, f.lse);
    }
  });
}

// dq rows of queries that see no key and dk, dv rows of keys no query sees are exactly 0.
void expect_blind_rows_zero(const Backward& g, const AttentionShape& s) {
  const std::vector<double> dq = g.dense_dq(s), dk = g.dense_dk(s), dv = g.dense_dv(s);
  const int64_t q_width = s.q_heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const int64_t v_width = s.kv_heads * s.value_dim();
  int64_t nonzero = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.q_len; ++i)
      if (keys_seen(s, i) == 0)
        for (int64_t x = 0; x < q_width; ++x) nonzero += dq[(b * s.q_len + i) * q_width + x] != 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      bool seen = false;
      for (int64_t i = 0; i < s.q_len; ++i)
        seen = seen || (j >= first_visible_key(s, i) && j < visible_keys(s, i));
      if (seen) continue;
      for (int64_t x = 0; x < kv_width; ++x) nonzero += dk[(b * s.kv_len + j) * kv_width + x] != 0;
      for (int64_t x = 0; x < v_width; ++x) nonzero += dv[(b * s.kv_len + j) * v_width + x] != 0;
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
  Case windowed = causal;  // a window of 3 keys and value heads 6 wide
  windowed.window = 3, windowed.Dv = 6;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);  // ~2000 tiny calls
  uint64_t seed = 7000;
  for (const Case& c : {causal, unmasked, windowed}) {
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

TEST(AttentionGeneral, ValuesInTheirOwnBufferEqualValuesBesideTheKeysBitForBit) {
  // Value heads of their own width in their own [B, Tk, Hkv * Dv] buffer (v_batch_stride, as the
  // attention component lays out v apart from k): the same elements at other addresses, so the
  // output, lse and every gradient equal the call with k and v sharing rows, in every path.
  Case c;
  c.B = 3, c.Tq = 40, c.Tk = 40, c.Hq = 4, c.Hkv = 2, c.D = 16, c.Dv = 8;
  Case wide = c;  // values wider than the keys
  wide.Dv = 24, wide.window = 9;
  uint64_t seed = 8500;
  for (const Case& shared : {c, wide}) {
    SCOPED_TRACE(shared.name());
    const Inputs in = make_inputs(shared, seed += 10);
    const AttentionShape& s = in.s;
    const int64_t v_width = s.kv_heads * s.value_dim();
    AttentionShape own = s;
    own.v_row_stride = v_width;
    own.v_batch_stride = s.kv_len * v_width;
    std::vector<float> v(static_cast<size_t>(s.batch * own.v_batch_stride));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = 0; t < s.kv_len; ++t)
        std::memcpy(&v[static_cast<size_t>(b * own.v_batch_stride + t * v_width)],
                    in.v() + b * s.kv_batch_stride + t * s.v_row_stride,
                    static_cast<size_t>(v_width) * sizeof(float));
    const auto check = [&](Precision precision, const AttentionOptions& options) {
      const Forward f = run_forward(in, precision, options);
      Forward o;
      o.out.assign(f.out.size(), 0.0f);
      o.lse.assign(f.lse.size(), 0.0f);
      MatmulEngine engine;
      attention_forward(o.out.data(), o.lse.data(), in.q(), in.k(), v.data(), own, precision,
                        engine, options);
      EXPECT_EQ(o.out, f.out);
      EXPECT_EQ(std::memcmp(o.lse.data(), f.lse.data(), f.lse.size() * sizeof(float)), 0);
      Backward g = run_backward(in, f, precision, options);
      std::vector<float> dq(in.q_buf.size()), dk(in.kv_buf.size()), dv(v.size());
      attention_backward(dq.data(), dk.data(), dv.data(), in.d_out.data(), in.q(), in.k(), v.data(),
                         o.out.data(), o.lse.data(), own, precision, engine, options);
      const std::vector<double> expected_dv = g.dense_dv(s);
      const std::vector<double> dq_rows = gather(
          dq.data(), s.batch, s.q_len, s.q_heads * s.head_dim, s.q_row_stride, s.q_batch_stride);
      const std::vector<double> dk_rows = gather(
          dk.data(), s.batch, s.kv_len, s.kv_heads * s.head_dim, s.k_row_stride, s.kv_batch_stride);
      EXPECT_EQ(dq_rows, g.dense_dq(s));
      EXPECT_EQ(dk_rows, g.dense_dk(s));
      EXPECT_EQ(gather(dv.data(), s.batch, s.kv_len, v_width, v_width, own.v_batch_stride),
                expected_dv);
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
  s = good;
  s.v_head_dim = -4;
  expect_error(forward(s), {"v_head_dim (-4)"});
  s = good;
  s.v_head_dim = 16;  // wider values than the rows hold
  expect_error(backward(s), {"v_row_stride", "value_dim()"});
  s = good;
  s.window = -1;
  expect_error(forward(s), {"window (-1)"});
  s = good;
  s.window = 3;
  s.mask = AttentionMask::none;
  expect_error(forward(s), {"sliding window needs the causal mask"});
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
