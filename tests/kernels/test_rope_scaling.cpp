// Tests of RoPE scaling (kernels/rope_scaling, kernels/rope_table): the inverse frequencies and
// attention factors of linear, dynamic, llama3 and yarn against the values transformers' own
// functions give (printed by tests/reference/rope_frequencies.py, so they are checked where no
// transformers venv exists), hand-derived properties of each type, the default table unchanged bit
// for bit, and one-line refusals of parameters out of range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/rope_scaling.hpp"
#include "lattice/kernels/rope_table.hpp"

namespace lattice::kernels {
namespace {

struct Reference {
  const char* name;
  double attention_factor;
  std::vector<double> inv_freq;
};

// tests/reference/rope_frequencies.py under transformers 5.25.0 (torch 2.15.0), head_dim 16.
const std::vector<Reference>& references() {
  static const std::vector<Reference> r = {
#include "rope_scaling_reference.inc"
  };
  return r;
}

// The same cases as the script's CASES: theta, the scaling, the sequence length (dynamic's).
struct Case {
  float theta;
  RopeScaling scaling;
  int64_t seq_len;
};

Case make_case(const std::string& name) {
  RopeScaling s;
  if (name == "linear") {
    s.type = RopeType::linear;
    s.factor = 4;
    return {10000.0f, s, 64};
  }
  if (name == "dynamic") {
    s.type = RopeType::dynamic;
    s.factor = 4;
    s.original_max_positions = 16;
    return {10000.0f, s, 64};
  }
  if (name == "llama3") {
    s.type = RopeType::llama3;
    s.factor = 8;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_positions = 16;
    return {500000.0f, s, 64};
  }
  s.type = RopeType::yarn;
  s.factor = 4;
  s.original_max_positions = name == "yarn" ? 16 : 2048;
  if (name == "yarn_mscale") {
    s.mscale = 0.707;
    s.mscale_all_dim = 1.0;
    s.truncate = false;
  }
  return {10000.0f, s, 8192};
}

TEST(RopeScaling, MatchesTransformersInverseFrequenciesAndAttentionFactors) {
  ASSERT_EQ(references().size(), 6u);
  for (const Reference& ref : references()) {
    SCOPED_TRACE(ref.name);
    const Case c = make_case(ref.name);
    const RopeFrequencies f = rope_frequencies(16, c.theta, c.scaling, c.seq_len);
    ASSERT_EQ(f.inv_freq.size(), ref.inv_freq.size());
    // The same fp32 operations in the same order as transformers' tensors: equal to the bit, but
    // dynamic's grown base, which torch raises to D/(D-2) with its own vectorised pow (a few ulps
    // from libm's powf): 6e-7 relative (5 ulps) there; a wrong formula is off by percents.
    const bool dynamic = std::string(ref.name) == "dynamic";
    for (size_t i = 0; i < ref.inv_freq.size(); ++i) {
      if (dynamic)
        EXPECT_NEAR(f.inv_freq[i], ref.inv_freq[i], 6e-7 * ref.inv_freq[i]) << "pair " << i;
      else
        EXPECT_EQ(f.inv_freq[i], static_cast<float>(ref.inv_freq[i])) << "pair " << i;
    }
    EXPECT_NEAR(f.attention_scaling, ref.attention_factor, 1e-7);
  }
}

TEST(RopeScaling, HandDerivedProperties) {
  // llama3 with the original context 16: wavelengths 2 pi / inv_freq below 16 / 4 = 4 are kept,
  // above 16 divided by the factor, and between them blended.
  const Case c = make_case("llama3");
  const RopeFrequencies plain = rope_frequencies(16, c.theta, {}, 0);
  const RopeFrequencies l3 = rope_frequencies(16, c.theta, c.scaling, 0);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < plain.inv_freq.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain.inv_freq[i];
    if (wavelen < 4) {
      EXPECT_EQ(l3.inv_freq[i], plain.inv_freq[i]);
      ++kept;
    } else if (wavelen > 16) {
      EXPECT_EQ(l3.inv_freq[i], plain.inv_freq[i] / 8.0f);
      ++divided;
    } else {
      EXPECT_LT(l3.inv_freq[i], plain.inv_freq[i]);
      EXPECT_GT(l3.inv_freq[i], plain.inv_freq[i] / 8.0f);
      ++blended;
    }
  }
  // 2 pi x 500000^(i/8): 6.3 for i = 0 (blended), 32.6 and more for the rest (divided).
  EXPECT_EQ(kept, 0);
  EXPECT_EQ(blended, 1);
  EXPECT_EQ(divided, 7);
  // Dynamic: at or below the original context the default frequencies; at 64 = 4 x 16 with factor
  // 4 the base is theta x 13^(16/14).
  RopeScaling dyn = make_case("dynamic").scaling;
  EXPECT_EQ(rope_frequencies(16, 10000.0f, dyn, 16).inv_freq,
            rope_frequencies(16, 10000.0f, {}, 0).inv_freq);
  const RopeFrequencies grown = rope_frequencies(16, 10000.0f, dyn, 64);
  const double base = 10000.0 * std::pow(13.0, 16.0 / 14.0);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(grown.inv_freq[i], std::pow(base, -i / 8.0), 1e-6 * std::pow(base, -i / 8.0));
  // yarn's attention factor without mscale: 0.1 ln(4) + 1.
  EXPECT_NEAR(rope_frequencies(16, 10000.0f, make_case("yarn").scaling, 0).attention_scaling,
              0.1 * std::log(4.0) + 1, 1e-7);
}

TEST(RopeScaling, DefaultTableIsBitIdenticalToTheUnscaledFormula) {
  const RopeTable table(64, 16, 500000.0f);
  EXPECT_EQ(table.attention_scaling(), 1.0f);
  for (int64_t t = 0; t < 64; ++t)
    for (int64_t i = 0; i < 8; ++i) {
      const float inv = 1.0f / std::pow(500000.0f, static_cast<float>(2 * i) / 16.0f);
      const float angle = static_cast<float>(t) * inv;
      EXPECT_EQ(table.cos()[t * 8 + i], std::cos(angle));
      EXPECT_EQ(table.sin()[t * 8 + i], std::sin(angle));
    }
}

TEST(RopeScaling, TableAppliesTheFrequenciesAndTheAttentionFactor) {
  const Case c = make_case("yarn_ramp");
  const RopeTable table(32, 16, c.theta, c.scaling);
  const RopeFrequencies f = rope_frequencies(16, c.theta, c.scaling, 32);
  EXPECT_EQ(table.inv_freq(), f.inv_freq);
  for (int64_t t = 0; t < 32; ++t)
    for (int64_t i = 0; i < 8; ++i) {
      const float angle = static_cast<float>(t) * f.inv_freq[static_cast<size_t>(i)];
      EXPECT_EQ(table.cos()[t * 8 + i], std::cos(angle) * f.attention_scaling);
      EXPECT_EQ(table.sin()[t * 8 + i], std::sin(angle) * f.attention_scaling);
    }
  // Dynamic is computed for the table's length.
  const RopeScaling dyn = make_case("dynamic").scaling;
  EXPECT_EQ(RopeTable(64, 16, 10000.0f, dyn).inv_freq(),
            rope_frequencies(16, 10000.0f, dyn, 64).inv_freq);
}

TEST(RopeScaling, RefusesParametersOutOfRange) {
  const auto refuses = [](RopeScaling s, const std::string& needle) {
    try {
      s.validate();
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  RopeScaling s;
  s.type = RopeType::llama3;
  s.factor = 8;
  refuses(s, "set model.rope_original_max_position_embeddings");
  s.original_max_positions = 8192;
  s.high_freq_factor = 1;
  refuses(s, "0 < model.rope_low_freq_factor < model.rope_high_freq_factor");
  s.type = RopeType::linear;
  s.factor = 0;
  refuses(s, "model.rope_factor must be positive");
  EXPECT_THROW(parse_rope_type("longrope"), Error);
  EXPECT_EQ(parse_rope_type("llama3"), RopeType::llama3);
  EXPECT_EQ(rope_type_name(RopeType::plain), "default");
}

}  // namespace
}  // namespace lattice::kernels
