// FLOP counts and training-time estimates (see compute_estimate.hpp).
#include "lattice/plan/compute_estimate.hpp"

#include "lattice/core/error.hpp"

namespace lattice::plan {

ForwardFlops forward_flops_per_sequence(const ModelSpec& m) {
  const double s = static_cast<double>(m.seq_len);
  const double h = static_cast<double>(m.d_model);
  const double kv_width = static_cast<double>(m.n_kv_heads * m.head_dim());
  const double a = static_cast<double>(m.attention_width());  // h unless heads are wider
  const double f = static_cast<double>(m.ffn_hidden);
  const double per_token_layer =
      2 * (h * a + 2 * h * kv_width + a * h) +                      // QKV + out
      2 * (m.gated_mlp() ? 3 : 2) * h * f * m.top_k +               // MLP
      (m.is_moe() ? 2 * h * static_cast<double>(m.n_experts) : 0);  // router
  ForwardFlops flops;
  flops.dense_gemms = per_token_layer * s * m.n_layers;
  // QK^T and PV over the keys each query attends to (every position, or the sliding window).
  flops.attention_core = 4 * s * static_cast<double>(m.attended_keys(m.seq_len)) * a * m.n_layers;
  if (m.family == model::Family::deepseek) {
    // DeepSeek: the attention projections as they are (MLA's five GEMMs), the MLPs a token runs
    // (dense layers' ffn_hidden, MoE layers' top_k routed and shared experts, the router), and the
    // scores over qk_head_dim, the values over v_head_dim channels per head.
    const double L = static_cast<double>(m.n_layers), moe = static_cast<double>(m.moe_layers());
    const double expert = static_cast<double>(m.expert_ffn_hidden());
    const double mlp_macs =
        (L - moe) * 3 * h * f +
        moe * (3 * h * expert * static_cast<double>(m.top_k + m.moe_shared_experts) +
               h * static_cast<double>(m.n_experts));
    flops.dense_gemms =
        s * (2 * L * static_cast<double>(m.attention_projection_macs()) + 2 * mlp_macs);
    const double head_widths = static_cast<double>(m.head_dim() + m.value_head_dim());
    flops.attention_core = 2 * s * static_cast<double>(m.attended_keys(m.seq_len)) *
                           static_cast<double>(m.n_heads) * head_widths * L;
  }
  flops.logits = 2 * s * h * static_cast<double>(m.vocab_size);
  return flops;
}

double model_flops_per_sequence(const ModelSpec& m) {
  return 3 * forward_flops_per_sequence(m).total();
}

double hardware_flops_per_sequence(const ModelSpec& m, Recompute recompute) {
  const ForwardFlops f = forward_flops_per_sequence(m);
  double flops = 3 * f.total();
  if (recompute == Recompute::kFull) flops += f.dense_gemms + f.attention_core;
  if (recompute == Recompute::kSelective) flops += f.attention_core;
  return flops;
}

double korthikanti_model_flops(const ModelSpec& m, double batch) {
  const double s = m.seq_len, h = m.d_model, L = m.n_layers, V = m.vocab_size;
  return 72 * batch * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L));
}

double korthikanti_selective_hardware_flops(const ModelSpec& m, double batch) {
  const double s = m.seq_len, h = m.d_model, L = m.n_layers, V = m.vocab_size;
  return 72 * batch * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L));
}

double megatron_flops_with_recompute(const ModelSpec& m, double batch) {
  const double s = m.seq_len, h = m.d_model, l = m.n_layers, V = m.vocab_size;
  return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

double palm_flops_per_token(const ModelSpec& m) {
  const ParameterCount count = count_parameters(m);
  const double n_active_non_embedding =
      static_cast<double>(count.active - count.embedding - count.output_head);
  return 6 * n_active_non_embedding +
         12.0 * m.n_layers * m.d_model * static_cast<double>(m.seq_len);  // H * Q = hidden
}

double megatron_training_seconds(double tokens, double parameters, int devices,
                                 double flops_per_device) {
  check(devices > 0 && flops_per_device > 0,
        "training time needs devices > 0 and a positive FLOP/s");
  return 8 * tokens * parameters / (devices * flops_per_device);
}

ComputeEstimate estimate_compute(const ModelSpec& m, const ParallelLayout& layout, double tokens,
                                 int devices, double model_flops_per_device) {
  check(tokens > 0, "the token budget must be positive");
  check(devices > 0 && model_flops_per_device > 0,
        "training time needs devices > 0 and a positive FLOP/s per device");
  ComputeEstimate e;
  const double per_sequence = model_flops_per_sequence(m);
  e.flops_per_token = per_sequence / m.seq_len;
  e.flops_per_step = per_sequence * layout.global_batch_size;
  e.hardware_flops_per_step =
      hardware_flops_per_sequence(m, layout.recompute) * layout.global_batch_size;
  e.total_flops = e.flops_per_token * tokens;
  e.total_flops_6nd = 6.0 * static_cast<double>(count_parameters(m).active) * tokens;
  e.steps = tokens / (static_cast<double>(m.seq_len) * layout.global_batch_size);
  e.seconds = e.total_flops / (devices * model_flops_per_device);
  return e;
}

}  // namespace lattice::plan
