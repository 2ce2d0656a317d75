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
  s.choice_bias = config.has_choice_bias();
  s.groups = config.moe_groups;
  s.top_groups = config.moe_top_groups;
  s.gelu = config.moe_activation == MoeActivation::gelu;
  return s;
}

MoeBalancing moe_balancing(const ModelConfig& config) {
  return {config.moe_aux_loss_coef, config.moe_z_loss_coef};
}

void MoeMlpActivations::release() {
  for (Tensor* t : {&logits, &scores, &weights, &x_expert, &gate, &up, &h, &out}) t->reset();
  experts.clear();
  dispatch = {};
  exchange = {};
}

MoeMlp::MoeMlp(ParameterStore& store, const std::string& prefix, int64_t d_model,
               int64_t ffn_hidden, const MoeSettings& settings, MoeNames names,
               const ExpertParallelGroup& ep)
    : store_(store), C_(d_model), F_(ffn_hidden), settings_(settings), ep_(ep) {
  check(settings.experts >= 1 && settings.top_k >= 1 && settings.top_k <= settings.experts,
        "model.top_k (" + std::to_string(settings.top_k) +
            ") must be in [1, model.n_experts = " + std::to_string(settings.experts) + "]");
  check(settings.capacity_factor >= 0,
        "the MoE capacity factor must be positive (or 0: dropless), not " +
            std::to_string(settings.capacity_factor));
  router_ = store.declare(prefix + "gate.weight", {settings.experts, C_}, InitKind::normal, true);
  // DeepSeek-V3's name; zero at the start, moved only by update_choice_bias (its gradient is
  // zero, so AdamW leaves it as it is: no decay on a vector).
  if (settings.choice_bias)
    choice_bias_ = store.declare(prefix + "gate.e_score_correction_bias", {settings.experts},
                                 InitKind::zeros, false);
  check(settings.experts % ep.size == 0,
        "model.n_experts = " + std::to_string(settings.experts) +
            " is not divisible by parallelism.ep = " + std::to_string(ep.size) +
            ": pick an ep that divides the experts");
  const bool mixtral = names == MoeNames::mixtral;
  // This rank's experts only (all of them without expert parallelism), under their global
  // indices; each held by this expert-parallel rank alone.
  const int64_t first = ep.first_expert(settings.experts);
  for (int64_t j = first; j < first + ep.local_experts(settings.experts); ++j) {
    const std::string e = prefix + "experts." + std::to_string(j) + ".";
    auto declare = [&](const char* mixtral_name, const char* deepseek_name, Shape shape,
                       InitKind init) {
      const std::string name = e + (mixtral ? mixtral_name : deepseek_name) + ".weight";
      if (ep.size == 1) return store.declare(name, shape, init, true);
      return store.declare_shard(name, shape, TensorShard{},
                                 mesh::AxisSet::all().without(mesh::Axis::ep), init, true);
    };
    // SwiGLU: gate w1, up w3, down w2; GELU: in w1 (DeepSeek's scheme: up_proj), out w2.
    w1_.push_back(
        declare("w1", settings.gelu ? "up_proj" : "gate_proj", {F_, C_}, InitKind::normal));
    if (!settings.gelu) w3_.push_back(declare("w3", "up_proj", {F_, C_}, InitKind::normal));
    w2_.push_back(declare("w2", "down_proj", {C_, F_}, InitKind::normal_residual));
  }
}

void MoeMlp::update_choice_bias(const std::vector<int64_t>& load, double rate) {
  check(choice_bias_ >= 0 && static_cast<int64_t>(load.size()) == settings_.experts,
        "a choice-bias update for a MoE layer without one, or with another expert count "
        "(internal error)");
  int64_t total = 0;
  for (int64_t count : load) total += count;
  // Compared as count · E against the total: exact, no rounding of the mean.
  const int64_t E = settings_.experts;
  float* bias = store_.mutable_value(choice_bias_);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t scaled = load[e] * E;
    if (scaled < total) bias[e] += static_cast<float>(rate);
    if (scaled > total) bias[e] -= static_cast<float>(rate);
  }
}

int64_t MoeMlp::max_copies(int64_t rows) const {
  const int64_t E = settings_.experts, K = settings_.top_k;
  if (settings_.capacity_factor <= 0) return rows * K;
  return std::min(rows * K, E * k::moe_capacity(settings_.capacity_factor, rows, K, E));
}

int64_t MoeMlp::saved_bytes(int64_t rows) const {
  // logits and scores [rows, E], weights and the choices [rows, K], the dispatch's slot_of
  // [rows, K], slot_token [S] and offsets; x_expert and out [S, C], gate, up and h [S, F].
  const int64_t E = settings_.experts, K = settings_.top_k, S = max_copies(rows);
  const int64_t hidden = settings_.gelu ? 2 : 3;  // gate (pre-activation), up, h
  return 4 * (2 * rows * E + 3 * rows * K + S + E + 1 + S * (2 * C_ + hidden * F_));
}

int64_t MoeMlp::transient_bytes(int64_t rows) const {
  // The backward's d_out, d_perm and d_part [S, C], d_h, d_gate and d_up [S, F], d_weights
  // [rows, K], d_logits [rows, E] and the router's input gradient [rows, C].
  const int64_t E = settings_.experts, K = settings_.top_k, S = max_copies(rows);
  const int64_t hidden = settings_.gelu ? 2 : 3;  // d_h, d_gate, d_up
  return 4 * (3 * S * C_ + hidden * S * F_ + rows * (K + E + C_));
}

k::RouterShape MoeMlp::router_shape(int64_t rows) const {
  k::RouterShape s;
  s.tokens = rows;
  s.experts = settings_.experts;
  s.top_k = settings_.top_k;
  s.score = settings_.score;
  s.normalize = settings_.normalize;
  s.scaling = settings_.scaling;
  s.groups = settings_.groups;
  s.top_groups = settings_.top_groups;
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
  ensure_activation(a.logits, {rows, E}, ctx);
  ensure_activation(a.scores, {rows, E}, ctx);
  ensure_activation(a.weights, {rows, K}, ctx);
  a.experts.assign(static_cast<size_t>(rows * K), 0);
  a.counts.assign(static_cast<size_t>(E), 0);
  a.score_sums.assign(static_cast<size_t>(E), 0.0);
  ctx.ops.linear_forward(a.logits.f32(), x, store_.value(router_), nullptr, rows, C_, E,
                         k::Precision::fp32, {});
  ctx.ops.moe_router_forward(a.experts.data(), a.weights.f32(), a.scores.f32(), a.logits.f32(),
                             choice_bias_ >= 0 ? store_.value(choice_bias_) : nullptr,
                             router_shape(rows), {a.counts.data(), a.score_sums.data(), &a.z_sum});
  const int64_t capacity =
      settings_.capacity_factor > 0 ? k::moe_capacity(settings_.capacity_factor, rows, K, E) : -1;
  a.dispatch = k::plan_moe_dispatch(a.experts.data(), rows, K, E, capacity);
  const int64_t S = a.dispatch.slots();
  ensure_activation(a.out, {S, C_}, ctx);
  // The local experts' input rows, expert-major: the gathered copies themselves on one rank;
  // under expert parallelism the copies this rank's experts received.
  const bool exchange = ep_.size > 1;
  Tensor gathered;
  if (exchange) {
    a.exchange = plan_expert_exchange(ep_, a.dispatch);
    ensure_activation(gathered, {S, C_}, ctx);
    ctx.ops.moe_gather(gathered.f32(), x, a.dispatch.slot_token.data(), S, C_);
    ensure_activation(a.x_expert, {std::max<int64_t>(a.exchange.received(), 1), C_}, ctx);
    send_to_experts(ep_, a.exchange, ctx.ops, a.x_expert.f32(), gathered.f32(), C_);
    gathered.reset();
  } else {
    a.exchange = {};
    ensure_activation(a.x_expert, {S, C_}, ctx);
    ctx.ops.moe_gather(a.x_expert.f32(), x, a.dispatch.slot_token.data(), S, C_);
  }
  const int64_t R = expert_rows(a);
  ensure_activation(a.gate, {R, F_}, ctx);
  if (!settings_.gelu) ensure_activation(a.up, {R, F_}, ctx);
  ensure_activation(a.h, {R, F_}, ctx);
  Tensor expert_out;  // under expert parallelism: the outputs before they go back
  if (exchange) ensure_activation(expert_out, {R, C_}, ctx);
  float* out = exchange ? expert_out.f32() : a.out.f32();
  // Grouped GEMMs: each local expert on its contiguous rows.
  for (int64_t j = 0; j < local_experts(); ++j) {
    const int64_t M = expert_count(a, j), at = expert_offset(a, j);
    if (M == 0) continue;
    const float* xe = a.x_expert.f32() + at * C_;
    float* gate = a.gate.f32() + at * F_;
    float* h = a.h.f32() + at * F_;
    ctx.ops.linear_forward(gate, xe, store_.value(w1_[j]), nullptr, M, C_, F_, precision, {});
    if (settings_.gelu) {
      ctx.ops.gelu_forward(h, gate, M * F_);
    } else {
      float* up = a.up.f32() + at * F_;
      ctx.ops.linear_forward(up, xe, store_.value(w3_[j]), nullptr, M, C_, F_, precision, {});
      ctx.ops.swiglu_forward(h, gate, up, M * F_);
    }
    ctx.ops.linear_forward(out + at * C_, h, store_.value(w2_[j]), nullptr, M, F_, C_, precision,
                           {});
  }
  if (exchange) return_from_experts(ep_, a.exchange, ctx.ops, a.out.f32(), out, C_);
  ctx.ops.moe_combine(y, a.out.f32(), a.weights.f32(), a.dispatch.slot_of.data(), rows, K, C_);
}

int64_t MoeMlp::expert_rows(const MoeMlpActivations& a) const {
  return ep_.size > 1 ? a.exchange.received() : a.dispatch.slots();
}
int64_t MoeMlp::expert_offset(const MoeMlpActivations& a, int64_t j) const {
  return ep_.size > 1 ? a.exchange.expert_offsets[j] : a.dispatch.offsets[j];
}
int64_t MoeMlp::expert_count(const MoeMlpActivations& a, int64_t j) const {
  return ep_.size > 1 ? a.exchange.expert_rows(j) : a.dispatch.count(j);
}

void MoeMlp::backward(const LayerContext& ctx, MoeMlpActivations& a, float* d_x, const float* d_y,
                      const float* x, int64_t rows, const k::RouterLossGradients& losses) {
  const int64_t E = settings_.experts, K = settings_.top_k, S = a.dispatch.slots();
  const int64_t R = expert_rows(a);
  const bool exchange = ep_.size > 1;
  auto* tr = ctx.tracker;
  DeviceMemory& memory = ctx.ops.memory();
  const auto f32 = k::Precision::fp32, precision = ctx.precision;
  Tensor d_out({S, C_}, DType::f32, memory, tr, MemoryCategory::activations);
  Tensor d_weights({rows, K}, DType::f32, memory, tr, MemoryCategory::activations);
  ctx.ops.moe_combine_backward(d_out.f32(), d_weights.f32(), d_y, a.out.f32(), a.weights.f32(),
                               a.dispatch.slot_of.data(), rows, K, C_);
  // The local experts' output gradients (expert-major) and their input gradients; under expert
  // parallelism they travel as the rows did.
  Tensor d_expert_out, d_expert_in;
  if (exchange) {
    ensure_activation(d_expert_out, {std::max<int64_t>(R, 1), C_}, ctx);
    send_to_experts(ep_, a.exchange, ctx.ops, d_expert_out.f32(), d_out.f32(), C_);
    d_out.reset();
  }
  const float* dy = exchange ? d_expert_out.f32() : d_out.f32();
  Tensor d_h({R, F_}, DType::f32, memory, tr, MemoryCategory::activations);
  Tensor d_gate({R, F_}, DType::f32, memory, tr, MemoryCategory::activations);
  Tensor d_up;
  if (!settings_.gelu) d_up = Tensor({R, F_}, DType::f32, memory, tr, MemoryCategory::activations);
  Tensor d_perm({std::max<int64_t>(R, 1), C_}, DType::f32, memory, tr, MemoryCategory::activations);
  Tensor d_part;
  if (!settings_.gelu)
    d_part =
        Tensor({std::max<int64_t>(R, 1), C_}, DType::f32, memory, tr, MemoryCategory::activations);
  for (int64_t j = 0; j < local_experts(); ++j) {
    const int64_t M = expert_count(a, j), at = expert_offset(a, j);
    if (M == 0) continue;
    const float* xe = a.x_expert.f32() + at * C_;
    float* dh = d_h.f32() + at * F_;
    float* dg = d_gate.f32() + at * F_;
    ctx.ops.linear_backward(dh, store_.grad(w2_[j]), nullptr, dy + at * C_, a.h.f32() + at * F_,
                            store_.value(w2_[j]), M, F_, C_, precision, {});
    if (settings_.gelu) {
      ctx.ops.gelu_backward(dg, dh, a.gate.f32() + at * F_, M * F_);
    } else {
      float* du = d_up.f32() + at * F_;
      ctx.ops.swiglu_backward(dg, du, dh, a.gate.f32() + at * F_, a.up.f32() + at * F_, M * F_);
      ctx.ops.linear_backward(d_part.f32() + at * C_, store_.grad(w3_[j]), nullptr, du, xe,
                              store_.value(w3_[j]), M, C_, F_, precision, {});
    }
    // d_perm after d_part: the SwiGLU sum below adds the up half to the gate half.
    ctx.ops.linear_backward(d_perm.f32() + at * C_, store_.grad(w1_[j]), nullptr, dg, xe,
                            store_.value(w1_[j]), M, C_, F_, precision, {});
  }
  if (!settings_.gelu) ctx.ops.add_inplace(d_perm.f32(), d_part.f32(), R * C_);
  d_part.reset();
  if (exchange) {
    ensure_activation(d_expert_in, {std::max<int64_t>(S, 1), C_}, ctx);
    return_from_experts(ep_, a.exchange, ctx.ops, d_expert_in.f32(), d_perm.f32(), C_);
  }
  ctx.ops.moe_gather_backward(d_x, exchange ? d_expert_in.f32() : d_perm.f32(),
                              a.dispatch.slot_of.data(), rows, K, C_);
  // The router: the weights' gradient (and the balancing losses') to the logits, then its Linear.
  Tensor d_logits({rows, E}, DType::f32, memory, tr, MemoryCategory::activations);
  ctx.ops.moe_router_backward(d_logits.f32(), d_weights.f32(), a.experts.data(), a.scores.f32(),
                              a.logits.f32(), router_shape(rows), losses);
  Tensor d_router_in({rows, C_}, DType::f32, memory, tr, MemoryCategory::activations);
  ctx.ops.linear_backward(d_router_in.f32(), store_.grad(router_), nullptr, d_logits.f32(), x,
                          store_.value(router_), rows, C_, E, f32, {});
  ctx.ops.add_inplace(d_x, d_router_in.f32(), rows * C_);
}

}  // namespace lattice::model
