// The operands of a mixture-of-experts router, which every backend takes (kernels::Ops::
// moe_router_forward / _backward; the CPU kernels are kernels/cpu/moe_router.hpp). A router turns
// each token's logits over the experts into scores — softmax (Switch, GShard, Mixtral, Qwen3-MoE)
// or sigmoid (DeepSeek-V3) — picks the token's top_k experts by score (plus an optional per-expert
// bias that only steers the choice: DeepSeek-V3's auxiliary-loss-free balancing), and weights
// their outputs by the chosen scores, renormalised over the chosen ones when asked, times a scale.
#pragma once

#include <cstdint>

namespace lattice::kernels {

enum class RouterScore { softmax, sigmoid };

struct RouterShape {
  int64_t tokens = 0, experts = 0, top_k = 1;
  RouterScore score = RouterScore::softmax;
  bool normalize = true;  // weights = chosen scores / their sum (else the chosen scores)
  float scaling = 1.0f;   // every weight times this (DeepSeek-V3's routed scaling factor)
  // Group-limited routing (DeepSeek-V3's n_group, topk_group): the experts form `groups` equal
  // groups, each scored by the sum of its two largest choice keys (score + bias); a token's top_k
  // are chosen within its `top_groups` best groups (ties to the lower index). 1, 1: no groups.
  int64_t groups = 1, top_groups = 1;
};

// What the forward counts for the balancing losses and the metrics (each null to skip): per
// expert, the tokens routed to it and the sum of its scores over all tokens (in double, in token
// order within fixed chunks: independent of the thread count); and the sum over tokens of the
// squared log-sum-exp of the logits (the router z-loss's numerator).
struct RouterStatistics {
  int64_t* counts = nullptr;     // [experts]
  double* score_sums = nullptr;  // [experts]
  double* z_sum = nullptr;       // one value
};

// The gradients the backward adds besides the weights': `score_grad` [experts] (or null) is added
// to every token's gradient of its scores — the Switch load-balancing loss
// aux = coefficient · E · Σ_e f_e · mean_t(score_te) contributes coefficient · E · f_e / T for
// expert e, with the load f_e counted by the caller (over whatever group it balances) — and
// `z_grad` times 2 · lse_t times the softmax of the logits is added to token t's logit gradient
// (the z-loss coefficient / T; 0 for none).
struct RouterLossGradients {
  const float* score_grad = nullptr;
  float z_grad = 0.0f;
};

}  // namespace lattice::kernels
