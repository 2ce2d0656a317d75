// Mixture-of-experts routing on the CPU: scores, top-k choice and weights (forward), and the
// logits' gradient through the weights and the balancing losses (backward). Tokens run in parallel;
// every result is independent of the thread count.
#pragma once

#include <cstdint>

#include "lattice/kernels/moe_routing.hpp"

namespace lattice::kernels {

// logits [tokens, experts] -> scores [tokens, experts] (kept for the backward), experts and
// weights [tokens, top_k]: each token's chosen experts in descending order of score + bias (bias
// [experts] or null; ties to the lower index), and their weights. `stats` as RouterStatistics
// says.
void moe_router_forward(int32_t* experts, float* weights, float* scores, const float* logits,
                        const float* bias, const RouterShape& shape,
                        const RouterStatistics& stats = {});

// d_logits [tokens, experts] (overwritten) from d_weights [tokens, top_k], the forward's experts
// and scores, the logits (for the z-loss) and the balancing losses' gradients.
void moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                         const float* scores, const float* logits, const RouterShape& shape,
                         const RouterLossGradients& losses = {});

}  // namespace lattice::kernels
