// RoPE scaling: transformers' rope parameter functions (modeling_rope_utils.py, 4.46 and 5.x),
// each fp32 tensor operation one rounded fp32 operation here, Python's scalars in double.
#include "lattice/kernels/rope_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

std::string rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::plain:
      return "default";
    case RopeType::linear:
      return "linear";
    case RopeType::dynamic:
      return "dynamic";
    case RopeType::llama3:
      return "llama3";
    case RopeType::yarn:
      return "yarn";
  }
  return "default";
}

RopeType parse_rope_type(const std::string& name) {
  for (RopeType t :
       {RopeType::plain, RopeType::linear, RopeType::dynamic, RopeType::llama3, RopeType::yarn})
    if (rope_type_name(t) == name) return t;
  throw Error("unknown RoPE type '" + name +
              "': use default, linear, dynamic, llama3 or yarn (transformers' rope_type names)");
}

void RopeScaling::validate() const {
  if (type == RopeType::plain) return;
  const std::string what = "model.rope_type = " + rope_type_name(type) + ": ";
  check(std::isfinite(factor) && factor > 0,
        what + "model.rope_factor must be positive (transformers uses >= 1), got " +
            std::to_string(factor));
  if (type == RopeType::linear) return;
  check(original_max_positions > 0,
        what + "set model.rope_original_max_position_embeddings (the pre-training context) > 0");
  if (type == RopeType::llama3)
    check(low_freq_factor > 0 && high_freq_factor > low_freq_factor,
          what +
              "needs 0 < model.rope_low_freq_factor < model.rope_high_freq_factor (Llama 3.1: "
              "1 and 4)");
  if (type == RopeType::yarn) {
    check(beta_fast > 0 && beta_slow > 0,
          what + "model.rope_beta_fast and model.rope_beta_slow must be positive (32 and 1)");
    check(!attention_factor || *attention_factor > 0,
          what + "model.rope_attention_factor must be positive (unset: from the factor)");
  }
}

namespace {

// transformers' yarn_get_mscale: 0.1 * mscale * ln(scale) + 1, 1 for scale <= 1.
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The default inverse frequencies: 1 / theta^(2i/D), fp32 (Lattice's table before scaling existed,
// bit for bit).
std::vector<float> default_inv_freq(int64_t head_dim, float theta) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(theta, exponent);
  }
  return inv;
}

// _compute_llama3_parameters: low frequencies divided by factor, high ones kept, a smooth ramp
// between (by wavelength against the original context).
void apply_llama3(std::vector<float>& inv, const RopeScaling& s) {
  const auto old_context = static_cast<double>(s.original_max_positions);
  const auto low_wavelen = static_cast<float>(old_context / s.low_freq_factor);
  const auto high_wavelen = static_cast<float>(old_context / s.high_freq_factor);
  const auto two_pi = static_cast<float>(2 * std::numbers::pi);
  const auto factor = static_cast<float>(s.factor);
  const auto low = static_cast<float>(s.low_freq_factor);
  const auto span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  const auto context = static_cast<float>(s.original_max_positions);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (context / wavelen - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
}

// _compute_yarn_parameters: interpolated (1 / (factor * pos_freq)) and extrapolated (1 / pos_freq)
// frequencies blended by a linear ramp over the correction range of dimensions.
std::vector<float> yarn_inv_freq(int64_t head_dim, float theta, const RopeScaling& s) {
  const auto D = static_cast<double>(head_dim);
  const double base = theta;
  const auto original = static_cast<double>(s.original_max_positions);
  const auto correction_dim = [&](double rotations) {
    return (D * std::log(original / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, D - 1);
  if (low == high) high += 0.001;  // transformers: prevent the singularity
  const auto low_f = static_cast<float>(low), span = static_cast<float>(high - low);
  const auto factor = static_cast<float>(s.factor);
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float pos_freq = std::pow(theta, exponent);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

// _compute_dynamic_ntk_parameters: beyond the original context the base grows with the sequence
// length L, base * (factor * L / original - (factor - 1))^(D / (D - 2)). transformers computes it
// from the forward's positions, a tensor, so in fp32; at or below the original context it keeps
// the default frequencies.
std::vector<float> dynamic_inv_freq(int64_t head_dim, float theta, const RopeScaling& s,
                                    int64_t seq_len) {
  if (seq_len <= s.original_max_positions) return default_inv_freq(head_dim, theta);
  const auto D = static_cast<double>(head_dim);
  float growth = static_cast<float>(s.factor) * static_cast<float>(seq_len);
  growth = growth / static_cast<float>(s.original_max_positions);
  growth = growth - static_cast<float>(s.factor - 1);
  const float base = theta * std::pow(growth, static_cast<float>(D / (D - 2)));
  return default_inv_freq(head_dim, base);
}

}  // namespace

double yarn_attention_factor(const RopeScaling& s, double factor) {
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0)
    return yarn_get_mscale(factor, s.mscale) / yarn_get_mscale(factor, s.mscale_all_dim);
  return yarn_get_mscale(factor, 1.0);
}

double yarn_softmax_scale_factor(const RopeScaling& s) {
  if (s.type != RopeType::yarn || s.mscale_all_dim == 0) return 1.0;
  const double m = yarn_get_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

RopeFrequencies rope_frequencies(int64_t head_dim, float theta, const RopeScaling& s,
                                 int64_t seq_len) {
  check(head_dim > 0 && head_dim % 2 == 0,
        "RoPE: head_dim must be positive and even, got " + std::to_string(head_dim));
  check(theta > 0, "RoPE: theta must be positive (Llama uses 10000 or 500000)");
  s.validate();
  RopeFrequencies out;
  switch (s.type) {
    case RopeType::plain:
      out.inv_freq = default_inv_freq(head_dim, theta);
      break;
    case RopeType::linear:
      out.inv_freq = default_inv_freq(head_dim, theta);
      for (float& f : out.inv_freq) f /= static_cast<float>(s.factor);
      break;
    case RopeType::dynamic:
      out.inv_freq = dynamic_inv_freq(head_dim, theta, s, seq_len);
      break;
    case RopeType::llama3:
      out.inv_freq = default_inv_freq(head_dim, theta);
      apply_llama3(out.inv_freq, s);
      break;
    case RopeType::yarn:
      out.inv_freq = yarn_inv_freq(head_dim, theta, s);
      out.attention_scaling = static_cast<float>(yarn_attention_factor(s, s.factor));
      break;
  }
  return out;
}

}  // namespace lattice::kernels
