// A mixture-of-experts MLP on one rank: a router (an fp32 Linear [experts, d_model] to logits,
// then kernels::Ops::moe_router_forward: softmax or sigmoid scores, top-k, weights) picks each
// token's experts; the token copies are gathered into expert order (kernels/moe_dispatch.hpp,
// dropless or with a capacity), each expert — a SwiGLU MLP — runs as grouped GEMMs on its
// contiguous rows (in the context's precision), and the outputs are combined back weighted. A
// dropped copy adds nothing (its token passes through the block's residual). Parameters are named
// as Hugging Face's Mixtral ("<prefix>gate.weight", "<prefix>experts.<j>.w1.weight" gate, ".w3"
// up, ".w2" down) or DeepSeek's ("<prefix>experts.<j>.gate_proj/up_proj/down_proj.weight").
// Under expert parallelism each rank holds a slice of the experts and the copies travel to them
// (expert_parallel_comm.hpp); each copy's arithmetic is the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/kernels/moe_dispatch.hpp"
#include "lattice/kernels/moe_routing.hpp"
#include "lattice/model/expert_parallel_comm.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::model {

struct MoeSettings {
  int64_t experts = 8, top_k = 2;
  kernels::RouterScore score = kernels::RouterScore::softmax;
  bool normalize = true;
  float scaling = 1.0f;
  double capacity_factor = 0;  // 0: dropless; else each expert keeps ceil(factor·T·k/E) copies
  bool choice_bias = false;    // a per-expert bias steers the choice (auxiliary-loss-free)
  int64_t groups = 1, top_groups = 1;  // group-limited routing (kernels::RouterShape)
  bool gelu = false;           // GELU experts (in, GELU, out: 2 matrices) instead of SwiGLU
};
// A model's MoE layers' settings.
MoeSettings moe_settings(const ModelConfig& config);

// What the forward saves (rows = tokens, E experts, K = top_k, S = kept copies, F = ffn_hidden,
// R = the copies this rank's experts compute: S on one rank, the received ones under expert
// parallelism).
struct MoeMlpActivations {
  Tensor logits, scores;         // [rows, E]
  std::vector<int32_t> experts;  // [rows, K]
  Tensor weights;                // [rows, K]
  kernels::MoeDispatch dispatch;
  ExpertExchange exchange;  // expert parallelism: where the copies went and came from
  Tensor x_expert;          // [R, C] the local experts' input copies, expert-major
  Tensor gate, up, h;       // [R, F] the experts' pre-activations (GELU: gate only) and output
  Tensor out;               // [S, C] the experts' outputs for this rank's copies, in slot order
  // The router's statistics (tokens per expert, score sums, Σ lse²) for the balancing losses.
  std::vector<int64_t> counts;
  std::vector<double> score_sums;
  double z_sum = 0;
  void release();
};

// The balancing losses' coefficients: the Switch/GShard auxiliary load-balancing loss and the
// router z-loss (ST-MoE). 0 turns either off.
struct MoeBalancing {
  double aux_coefficient = 0, z_coefficient = 0;
};
MoeBalancing moe_balancing(const ModelConfig& config);

// A forward's balancing losses and the gradients its backward adds at the router. Over T tokens
// with k copies each: aux = α · E · Σ_e f_e · P_e, f_e = counts_e / (T · k) the share of copies
// expert e was chosen for (a constant of the step, as in Switch), P_e = score_sums_e / T its
// mean score (1 · α for a perfectly balanced router); z = β · Σ_t lse_t² / T. The gradients are
// those of loss_scale · (aux + z). With `group_counts` (the counts summed over the `group_size`
// ranks of a balancing group, each with T tokens), f_e is the group's and each rank's gradient
// is its part of the group's loss times group_size (the ranks' gradients are averaged).
struct MoeLossTerms {
  double aux = 0, z = 0;
  std::vector<float> score_grad;  // [experts]
  float z_grad = 0;
  kernels::RouterLossGradients gradients() const {
    return {score_grad.empty() ? nullptr : score_grad.data(), z_grad};
  }
};
MoeLossTerms moe_balancing_losses(const MoeMlpActivations& a, int64_t tokens,
                                  const MoeSettings& settings, const MoeBalancing& balancing,
                                  float loss_scale,
                                  const std::vector<int64_t>* group_counts = nullptr,
                                  int group_size = 1);

class MoeMlp {
 public:
  // With an expert-parallel group of P ranks, this rank holds experts [rank·E/P, (rank+1)·E/P)
  // (placed on every axis but ep) and forward and backward exchange the copies with the group
  // (expert_parallel_comm.hpp); E must be divisible by P.
  MoeMlp(ParameterStore& store, const std::string& prefix, int64_t d_model, int64_t ffn_hidden,
         const MoeSettings& settings, MoeNames names = MoeNames::mixtral,
         const ExpertParallelGroup& ep = {});

  // y [rows, C] from x [rows, C] (overwritten).
  void forward(const LayerContext& ctx, MoeMlpActivations& a, float* y, const float* x,
               int64_t rows);
  // d_x [rows, C] (overwritten) from d_y; the parameters' gradients accumulate. `losses` adds the
  // balancing losses' gradients to the router's (kernels/moe_routing.hpp).
  void backward(const LayerContext& ctx, MoeMlpActivations& a, float* d_x, const float* d_y,
                const float* x, int64_t rows, const kernels::RouterLossGradients& losses = {});

  const MoeSettings& settings() const { return settings_; }
  int64_t local_experts() const { return static_cast<int64_t>(w1_.size()); }
  // Auxiliary-loss-free balancing (settings().choice_bias): moves each expert's bias by `rate`
  // towards balance given the copies each expert received (`load`, [experts], over the ranks
  // that train together): + rate below the mean load, - rate above it, unchanged at it.
  void update_choice_bias(const std::vector<int64_t>& load, double rate);
  // The copies a forward of `rows` tokens routes (rows · top_k dropless; at most the experts'
  // capacity with a capacity factor): what saved_bytes and transient_bytes count.
  int64_t max_copies(int64_t rows) const;
  // Bytes a forward of `rows` tokens keeps in MoeMlpActivations, and the most the backward
  // allocates and frees again.
  int64_t saved_bytes(int64_t rows) const;
  int64_t transient_bytes(int64_t rows) const;

 private:
  kernels::RouterShape router_shape(int64_t rows) const;
  // The local experts' rows of a forward: in all, and local expert j's block.
  int64_t expert_rows(const MoeMlpActivations& a) const;
  int64_t expert_offset(const MoeMlpActivations& a, int64_t j) const;
  int64_t expert_count(const MoeMlpActivations& a, int64_t j) const;

  ParameterStore& store_;
  int64_t C_, F_;
  MoeSettings settings_;
  ExpertParallelGroup ep_;
  int router_ = -1;
  int choice_bias_ = -1;           // "<prefix>gate.e_score_correction_bias" [experts], when kept
  std::vector<int> w1_, w3_, w2_;  // per local expert: gate [F, C], up [F, C], down [C, F]
};

}  // namespace lattice::model
