// The simulator's cost model (see cost_model.hpp).
#include "lattice/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>

namespace lattice::plan {

double gemm_seconds(double m, double k, double n, const HardwareSpec& hw,
                    const CostParameters& cost, double batch) {
  const double d = cost.gemm_half_dimension;
  const double efficiency = cost.gemm_peak_fraction * (m / (m + d)) * (k / (k + d)) * (n / (n + d));
  return 2 * m * k * n * batch / (hw.peak_bf16_flops * efficiency);
}

double collective_bus_bandwidth(int group, int per_node, const HardwareSpec& hw,
                                const CostParameters& cost) {
  const double nvlink = hw.intra_node_bandwidth / 2 * cost.nvlink_efficiency;
  per_node = std::clamp(per_node, 1, group);
  if (per_node >= group) return nvlink;  // the whole group shares a node
  // Rings cross nodes through the NICs of the group's members on each node.
  return std::min(nvlink, per_node * hw.inter_node_bandwidth * cost.network_efficiency);
}

double collective_seconds(Collective op, double bytes, int group, int per_node,
                          const HardwareSpec& hw, const CostParameters& cost) {
  if (group <= 1 || bytes <= 0) return 0;
  const double n = group;
  const double factor = op == Collective::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
  return factor * bytes / collective_bus_bandwidth(group, per_node, hw, cost) +
         cost.collective_latency;
}

namespace {

// Members of a group of `group` ranks whose stride in the rank order is `stride` that share a node.
int members_per_node(int group, int stride, const HardwareSpec& hw) {
  return std::clamp(hw.devices_per_node / std::max(stride, 1), 1, group);
}

double memory_seconds(double bytes, const HardwareSpec& hw, const CostParameters& cost) {
  return bytes / (hw.memory_bandwidth * cost.memory_bandwidth_fraction);
}

}  // namespace

LayerCosts layer_costs(const ModelSpec& m, const ParallelLayout& l, const HardwareSpec& hw,
                       const CostParameters& cost) {
  const double t = l.tp;
  const double b = l.micro_batch_size;
  const double s_local = static_cast<double>(m.seq_len) / l.cp;
  const double tokens = b * s_local;
  const double h = static_cast<double>(m.d_model);
  const double f = static_cast<double>(m.ffn_hidden);
  const double hd = static_cast<double>(m.head_dim());
  const double kv_width = static_cast<double>(m.n_kv_heads * m.head_dim());
  const double a = static_cast<double>(m.attention_width());  // h unless heads are wider
  const double heads_local = static_cast<double>(m.n_heads) / t;
  const double local_experts = static_cast<double>(m.n_experts) / l.ep;
  // Tokens each local expert sees (balanced routing); the dense MLP is one expert seeing every
  // token.
  const double expert_tokens = tokens * m.top_k / static_cast<double>(m.n_experts) * l.ep;
  const double up_width = f * (m.gated_mlp() ? 2 : 1) / t;

  // Forward GEMMs (backward runs the same shapes twice: input and weight gradients).
  double dense_gemm = gemm_seconds(tokens, h, (a + 2 * kv_width) / t, hw, cost) +  // QKV
                      gemm_seconds(tokens, a / t, h, hw, cost) +                   // output proj
                      local_experts * (gemm_seconds(expert_tokens, h, up_width, hw, cost) +
                                       gemm_seconds(expert_tokens, f / t, h, hw, cost));  // MLP
  if (m.is_moe()) dense_gemm += gemm_seconds(tokens, h, static_cast<double>(m.n_experts), hw, cost);
  if (m.latent_attention()) {
    // Multi-head latent attention: its five projections instead of QKV and out. Under tp the
    // head projections are split (q_proj / q_b_proj and kv_b_proj by output heads, o_proj by
    // input heads) and q_a_proj and kv_a_proj_with_mqa run whole on every rank.
    const double H = static_cast<double>(m.n_heads), qk = hd, r = m.q_lora_rank;
    const double c = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim;
    const double v = m.v_head_dim;
    dense_gemm -= gemm_seconds(tokens, h, (a + 2 * kv_width) / t, hw, cost) +
                  gemm_seconds(tokens, a / t, h, hw, cost);
    dense_gemm += (r > 0 ? gemm_seconds(tokens, h, r, hw, cost) +
                               gemm_seconds(tokens, r, H * qk / t, hw, cost)
                         : gemm_seconds(tokens, h, H * qk / t, hw, cost)) +
                  gemm_seconds(tokens, h, c + rope, hw, cost) +            // kv_a_proj_with_mqa
                  gemm_seconds(tokens, c, H * (nope + v) / t, hw, cost) +  // kv_b_proj
                  gemm_seconds(tokens, H * v / t, h, hw, cost);            // o_proj
  }
  // QK^T and attention x V per head, queries local, keys all; FlashAttention skips the masked half.
  // Under a sliding window shorter than the sequence each query's band of window keys is computed
  // (the tiles beyond it skipped): no causal half to skip.
  const bool windowed = m.attended_keys(m.seq_len) < m.seq_len;
  const double keys = static_cast<double>(m.attended_keys(m.seq_len));
  const double causal_share = l.flash_attention && !windowed ? 0.5 : 1.0;
  const double attention_gemm =
      causal_share * (gemm_seconds(s_local, hd, keys, hw, cost, b * heads_local) +
                      gemm_seconds(s_local, keys, static_cast<double>(m.value_head_dim()), hw, cost,
                                   b * heads_local));  // scores over qk, values over v

  // Memory-bound traffic, bytes per forward (counted kernel by kernel; bf16 = 2 bytes).
  const double dropout_mask = m.has_dropout() ? 1 : 0;
  const double replicated_per_token = 2 * 4 * h                      // two norms: read + write
                                      + 2 * (6 + dropout_mask) * h;  // two bias-dropout-residual
  const double sharded_per_token =
      (m.gated_mlp() ? 6 : 4) * f * m.top_k / t                // activation function
      + (m.learned_positions() ? 0 : 4 * (a + kv_width) / t);  // rotary embedding on q, k
  const double score_bytes = l.flash_attention
                                 ? 0  // scores stay on chip
                                 : b * heads_local * s_local * static_cast<double>(m.seq_len) *
                                       (4 + (m.has_dropout() ? 5 : 0));  // softmax, dropout
  const double elementwise_bytes =
      tokens * (replicated_per_token / (l.sequence_parallel ? t : 1) + sharded_per_token);
  const double elementwise = memory_seconds(elementwise_bytes, hw, cost);
  const double softmax = memory_seconds(score_bytes, hw, cost);
  // Backward kernels read the saved input and the output gradient and write the input gradient.
  constexpr double kBackwardTrafficRatio = 1.5;

  // Tensor-parallel collectives: two per direction (allreduce, or all-gather + reduce-scatter with
  // sequence parallelism: the same bus volume). TP is innermost in the rank order.
  const double activation_bytes = tokens * h * 2;
  const double tp_collective =
      l.tp > 1 ? collective_seconds(Collective::kAllReduce, activation_bytes, l.tp,
                                    members_per_node(l.tp, 1, hw), hw, cost)
               : 0;
  // Expert parallel: all-to-all dispatch and combine of the routed tokens (stride tp * cp).
  const double ep_collective =
      l.ep > 1 ? 2 * collective_seconds(Collective::kAllToAll, tokens * m.top_k * h * 2, l.ep,
                                        members_per_node(l.ep, l.tp * l.cp, hw), hw, cost)
               : 0;
  // Context parallel: ring passes of K and V overlapped with the attention GEMMs; the excess is
  // exposed.
  double cp_exposed = 0;
  if (l.cp > 1) {
    const double kv_bytes = tokens * 2 * kv_width / t * 2;
    const double ring = collective_seconds(Collective::kAllGather, kv_bytes * l.cp, l.cp,
                                           members_per_node(l.cp, l.tp, hw), hw, cost);
    cp_exposed = std::max(0.0, ring - attention_gemm);
  }

  LayerCosts costs;
  const double forward_math = dense_gemm + attention_gemm + elementwise + softmax;
  const double forward_comm = 2 * tp_collective + ep_collective + cp_exposed;
  costs.forward_compute = forward_math;
  costs.forward_comm = forward_comm;
  costs.comm_forward = forward_comm;
  const double backward_memory = kBackwardTrafficRatio * (elementwise + softmax);
  const double backward_comm = 2 * tp_collective + ep_collective + 2 * cp_exposed;
  // Input gradients: one GEMM per weight GEMM, four attention GEMMs (dS, dV, dQ, dK); weight
  // gradients: one GEMM per weight GEMM.
  // FlashAttention's backward recomputes QK^T: five attention GEMMs.
  costs.backward_input = dense_gemm + (l.flash_attention ? 2.5 : 2.0) * attention_gemm +
                         backward_memory + backward_comm;
  costs.backward_weight = dense_gemm;
  switch (l.recompute) {
    case Recompute::kNone:
      break;
    case Recompute::kSelective:
      costs.recompute = attention_gemm + softmax;
      break;
    case Recompute::kFull:
      costs.recompute = forward_math + forward_comm;
      break;
  }
  costs.comm_backward = backward_comm + (l.recompute == Recompute::kFull ? forward_comm : 0);
  return costs;
}

EdgeCosts edge_costs(const ModelSpec& m, const ParallelLayout& l, const HardwareSpec& hw,
                     const CostParameters& cost) {
  const double t = l.tp;
  const double tokens = l.micro_batch_size * static_cast<double>(m.seq_len) / l.cp;
  const double h = static_cast<double>(m.d_model);
  const double vocab = static_cast<double>(m.vocab_size);
  EdgeCosts e;
  // Embedding: gather rows (+ position add, dropout), and its gradient scatter.
  e.embedding_forward = memory_seconds(tokens * h * 2 * 3, hw, cost);
  e.embedding_backward = memory_seconds(tokens * h * 2 * 3, hw, cost);
  // Head: final norm, logits GEMM over the local vocabulary shard, fp32 softmax cross-entropy.
  const double logits = gemm_seconds(tokens, h, vocab / t, hw, cost);
  const double loss_bytes = tokens * vocab / t * (2 + 4 + 4);
  const double norm_bytes = tokens * h * 2 * 2;
  e.head_forward = logits + memory_seconds(loss_bytes + norm_bytes, hw, cost);
  e.head_backward = 2 * logits + memory_seconds(loss_bytes + 2 * norm_bytes, hw, cost);
  if (l.tp > 1) {  // vocabulary-parallel loss: small allreduces of max and sum per token
    const double reduce = collective_seconds(Collective::kAllReduce, tokens * 4 * 2, l.tp,
                                             members_per_node(l.tp, 1, hw), hw, cost);
    e.head_forward += reduce;
  }
  return e;
}

double pipeline_transfer_seconds(const ModelSpec& m, const ParallelLayout& l,
                                 const HardwareSpec& hw, const CostParameters& cost) {
  if (l.pp <= 1) return 0;
  const double bytes = l.micro_batch_size * static_cast<double>(m.seq_len) / l.cp * m.d_model * 2;
  const int ranks_per_stage = l.tp * l.cp * l.dp;  // pp is outermost in the rank order
  const bool crosses_nodes = ranks_per_stage >= hw.devices_per_node;
  // Each TP rank sends its 1/t share over its own link (Megatron's scatter-gather); with a node
  // boundary the receiving node re-assembles it over NVLink.
  const double share = bytes / l.tp;
  if (!crosses_nodes)
    return share / (hw.intra_node_bandwidth / 2 * cost.nvlink_efficiency) + cost.collective_latency;
  double seconds =
      share / (hw.inter_node_bandwidth * cost.network_efficiency) + cost.collective_latency;
  if (l.tp > 1)
    seconds += collective_seconds(Collective::kAllGather, bytes, l.tp,
                                  members_per_node(l.tp, 1, hw), hw, cost);
  return seconds;
}

double optimizer_seconds(double local_params, const ParallelLayout& l, const HardwareSpec& hw,
                         const CostParameters& cost) {
  // Read gradient + optimizer state, write optimizer state + bf16 weights, one more gradient read
  // for the global norm.
  const double bytes_per_param = 2.0 * l.grad_bytes + 2.0 * l.optimizer_bytes + l.param_bytes;
  return memory_seconds(local_params * bytes_per_param, hw, cost);
}

}  // namespace lattice::plan
