// The mixture-of-experts MLP: see moe_mlp.hpp.
#include "lattice/model/moe_mlp.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"
#include "lattice/model/block.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

MoeSettings moe_settings(const ModelConfig& config) {
  MoeSettings s;
  s.experts = config.n_experts;
  s.top_k = config.top_k;
  s.score = config.moe_score;
  s.normalize = config.moe_normalize;
  s.scaling = config.moe_scaling;
  s.capacity_factor = config.moe_capacity_factor.value_or(0.0);
  return s;
}

MoeBalancing moe_balancing(const ModelConfig& config) {
  return {config.moe_aux_loss_coef, config.moe_z_loss_coef};
}

void MoeMlpActivations::release() {
  for (Tensor* t : {&logits, &scores, &weights, &x_perm, &gate, &up, &h, &out}) t->reset();
  experts.clear();
  dispatch = {};
}

MoeMlp::MoeMlp(ParameterStore& store, const std::string& prefix, int64_t d_model,
               int64_t ffn_hidden, const MoeSettings& settings, MoeNames names)
    : store_(store), C_(d_model), F_(ffn_hidden), settings_(settings) {
  check(settings.experts >= 1 && settings.top_k >= 1 && settings.top_k <= settings.experts,
        "model.top_k (" + std::to_string(settings.top_k) +
            ") must be in [1, model.n_experts = " + std::to_string(settings.experts) + "]");
  check(settings.capacity_factor >= 0,
        "the MoE capacity factor must be positive (or 0: dropless), not " +
            std::to_string(settings.capacity_factor));
  router_ = store.declare(prefix + "gate.weight", {settings.experts, C_}, InitKind::normal, true);
  const bool mixtral = names == MoeNames::mixtral;
  for (int64_t j = 0; j < settings.experts; ++j) {
    const std::string e = prefix + "experts." + std::to_string(j) + ".";
    w1_.push_back(store.declare(e + (mixtral ? "w1" : "gate_proj") + ".weight", {F_, C_},
                                InitKind::normal, true));
    w3_.push_back(store.declare(e + (mixtral ? "w3" : "up_proj") + ".weight", {F_, C_},
                                InitKind::normal, true));
    w2_.push_back(store.declare(e + (mixtral ? "w2" : "down_proj") + ".weight", {C_, F_},
                                InitKind::normal_residual, true));
  }
}

int64_t MoeMlp::max_copies(int64_t rows) const {
  const int64_t E = settings_.experts, K = settings_.top_k;
  if (settings_.capacity_factor <= 0) return rows * K;
  return std::min(rows * K, E * k::moe_capacity(settings_.capacity_factor, rows, K, E));
}

int64_t MoeMlp::saved_bytes(int64_t rows) const {
  // logits and scores [rows, E], weights and the choices [rows, K], the dispatch's slot_of
  // [rows, K], slot_token [S] and offsets; x_perm and out [S, C], gate, up and h [S, F].
  const int64_t E = settings_.experts, K = settings_.top_k, S = max_copies(rows);
  return 4 * (2 * rows * E + 3 * rows * K + S + E + 1 + S * (2 * C_ + 3 * F_));
}

int64_t MoeMlp::transient_bytes(int64_t rows) const {
  // The backward's d_out, d_perm and d_part [S, C], d_h, d_gate and d_up [S, F], d_weights
  // [rows, K], d_logits [rows, E] and the router's input gradient [rows, C].
  const int64_t E = settings_.experts, K = settings_.top_k, S = max_copies(rows);
  return 4 * (3 * S * C_ + 3 * S * F_ + rows * (K + E + C_));
}

k::RouterShape MoeMlp::router_shape(int64_t rows) const {
  k::RouterShape s;
  s.tokens = rows;
  s.experts = settings_.experts;
  s.top_k = settings_.top_k;
  s.score = settings_.score;
  s.normalize = settings_.normalize;
  s.scaling = settings_.scaling;
  return s;
}

MoeLossTerms moe_balancing_losses(const MoeMlpActivations& a, int64_t tokens,
                                  const MoeSettings& settings, const MoeBalancing& balancing,
                                  float loss_scale, const std::vector<int64_t>* group_counts,
                                  int group_size) {
  MoeLossTerms terms;
  const int64_t E = settings.experts, K = settings.top_k;
  const double T = static_cast<double>(tokens);
  const std::vector<int64_t>& counts = group_counts != nullptr ? *group_counts : a.counts;
  const double group_copies = T * static_cast<double>(group_size) * static_cast<double>(K);
  if (balancing.aux_coefficient != 0) {
    terms.score_grad.assign(static_cast<size_t>(E), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      // The group's share f_e; this rank's P_e (the mean of the ranks' P_e is the group's).
      const double f = static_cast<double>(counts[e]) / group_copies;
      terms.aux += balancing.aux_coefficient * static_cast<double>(E) * f * a.score_sums[e] / T;
      terms.score_grad[e] = static_cast<float>(loss_scale * balancing.aux_coefficient *
                                               static_cast<double>(E) * f / T);
    }
  }
  if (balancing.z_coefficient != 0) {
    terms.z = balancing.z_coefficient * a.z_sum / T;
    terms.z_grad = static_cast<float>(loss_scale * balancing.z_coefficient / T);
  }
  return terms;
}

void MoeMlp::forward(const LayerContext& ctx, MoeMlpActivations& a, float* y, const float* x,
                     int64_t rows) {
  const k::Precision precision = ctx.precision;  // the experts' GEMMs; the router stays fp32
  const int64_t E = settings_.experts, K = settings_.top_k;
  auto* tr = ctx.tracker;
  ensure_activation(a.logits, {rows, E}, tr);
  ensure_activation(a.scores, {rows, E}, tr);
  ensure_activation(a.weights, {rows, K}, tr);
  a.experts.assign(static_cast<size_t>(rows * K), 0);
  a.counts.assign(static_cast<size_t>(E), 0);
  a.score_sums.assign(static_cast<size_t>(E), 0.0);
  ctx.ops.linear_forward(a.logits.f32(), x, store_.value(router_), nullptr, rows, C_, E,
                         k::Precision::fp32, {});
  ctx.ops.moe_router_forward(a.experts.data(), a.weights.f32(), a.scores.f32(), a.logits.f32(),
                             nullptr, router_shape(rows),
                             {a.counts.data(), a.score_sums.data(), &a.z_sum});
  const int64_t capacity =
      settings_.capacity_factor > 0 ? k::moe_capacity(settings_.capacity_factor, rows, K, E) : -1;
  a.dispatch = k::plan_moe_dispatch(a.experts.data(), rows, K, E, capacity);
  const int64_t S = a.dispatch.slots();
  ensure_activation(a.x_perm, {S, C_}, tr);
  ensure_activation(a.gate, {S, F_}, tr);
  ensure_activation(a.up, {S, F_}, tr);
  ensure_activation(a.h, {S, F_}, tr);
  ensure_activation(a.out, {S, C_}, tr);
  ctx.ops.moe_gather(a.x_perm.f32(), x, a.dispatch.slot_token.data(), S, C_);
  // Grouped GEMMs: each expert on its contiguous rows.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = a.dispatch.count(e), at = a.dispatch.offsets[e];
    if (M == 0) continue;
    const float* xe = a.x_perm.f32() + at * C_;
    float* gate = a.gate.f32() + at * F_;
    float* up = a.up.f32() + at * F_;
    float* h = a.h.f32() + at * F_;
    ctx.ops.linear_forward(gate, xe, store_.value(w1_[e]), nullptr, M, C_, F_, precision, {});
    ctx.ops.linear_forward(up, xe, store_.value(w3_[e]), nullptr, M, C_, F_, precision, {});
    ctx.ops.swiglu_forward(h, gate, up, M * F_);
    ctx.ops.linear_forward(a.out.f32() + at * C_, h, store_.value(w2_[e]), nullptr, M, F_, C_,
                           precision, {});
  }
  ctx.ops.moe_combine(y, a.out.f32(), a.weights.f32(), a.dispatch.slot_of.data(), rows, K, C_);
}

void MoeMlp::backward(const LayerContext& ctx, MoeMlpActivations& a, float* d_x, const float* d_y,
                      const float* x, int64_t rows, const k::RouterLossGradients& losses) {
  const int64_t E = settings_.experts, K = settings_.top_k, S = a.dispatch.slots();
  auto* tr = ctx.tracker;
  const auto f32 = k::Precision::fp32, precision = ctx.precision;
  Tensor d_out({S, C_}, DType::f32, tr, MemoryCategory::activations);
  Tensor d_weights({rows, K}, DType::f32, tr, MemoryCategory::activations);
  ctx.ops.moe_combine_backward(d_out.f32(), d_weights.f32(), d_y, a.out.f32(), a.weights.f32(),
                               a.dispatch.slot_of.data(), rows, K, C_);
  Tensor d_h({S, F_}, DType::f32, tr, MemoryCategory::activations);
  Tensor d_gate({S, F_}, DType::f32, tr, MemoryCategory::activations);
  Tensor d_up({S, F_}, DType::f32, tr, MemoryCategory::activations);
  Tensor d_perm({S, C_}, DType::f32, tr, MemoryCategory::activations);
  Tensor d_part({S, C_}, DType::f32, tr, MemoryCategory::activations);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = a.dispatch.count(e), at = a.dispatch.offsets[e];
    if (M == 0) continue;
    const float* xe = a.x_perm.f32() + at * C_;
    float* dh = d_h.f32() + at * F_;
    float* dg = d_gate.f32() + at * F_;
    float* du = d_up.f32() + at * F_;
    ctx.ops.linear_backward(dh, store_.grad(w2_[e]), nullptr, d_out.f32() + at * C_,
                            a.h.f32() + at * F_, store_.value(w2_[e]), M, F_, C_, precision, {});
    ctx.ops.swiglu_backward(dg, du, dh, a.gate.f32() + at * F_, a.up.f32() + at * F_, M * F_);
    ctx.ops.linear_backward(d_perm.f32() + at * C_, store_.grad(w1_[e]), nullptr, dg, xe,
                            store_.value(w1_[e]), M, C_, F_, precision, {});
    ctx.ops.linear_backward(d_part.f32() + at * C_, store_.grad(w3_[e]), nullptr, du, xe,
                            store_.value(w3_[e]), M, C_, F_, precision, {});
  }
  ctx.ops.add_inplace(d_perm.f32(), d_part.f32(), S * C_);
  ctx.ops.moe_gather_backward(d_x, d_perm.f32(), a.dispatch.slot_of.data(), rows, K, C_);
  // The router: the weights' gradient (and the balancing losses') to the logits, then its Linear.
  Tensor d_logits({rows, E}, DType::f32, tr, MemoryCategory::activations);
  ctx.ops.moe_router_backward(d_logits.f32(), d_weights.f32(), a.experts.data(), a.scores.f32(),
                              a.logits.f32(), router_shape(rows), losses);
  Tensor d_router_in({rows, C_}, DType::f32, tr, MemoryCategory::activations);
  ctx.ops.linear_backward(d_router_in.f32(), store_.grad(router_), nullptr, d_logits.f32(), x,
                          store_.value(router_), rows, C_, E, f32, {});
  ctx.ops.add_inplace(d_x, d_router_in.f32(), rows * C_);
}

}  // namespace lattice::model
