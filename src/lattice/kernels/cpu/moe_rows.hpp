// The row moves around a mixture-of-experts layer's expert GEMMs on the CPU (moe_dispatch.hpp
// says where each token's copies go): the gather into expert order and the weighted combine back,
// and their backwards. Parallel over rows or tokens; every output row is written by one thread in a
// fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace lattice::kernels {

// out [slots, C] = x[slot_token[s]].
void moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots, int64_t C);

// d_x [tokens, C] = Σ_k d_out[slot_of[t·top_k + k]] over the token's kept copies, in k order
// (overwritten; 0 for a token whose copies were all dropped).
void moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of, int64_t tokens,
                         int64_t top_k, int64_t C);

// y [tokens, C] = Σ_k weights[t·top_k + k] · expert_out[slot_of[t·top_k + k]] over the kept
// copies, in k order (overwritten).
void moe_combine(float* y, const float* expert_out, const float* weights, const int32_t* slot_of,
                 int64_t tokens, int64_t top_k, int64_t C);

// The combine's backward: d_expert_out[slot of copy (t, k)] = weights[t·top_k + k] · dy[t] (each
// kept slot belongs to one copy) and d_weights[t·top_k + k] = dy[t] · expert_out[slot] (0 for a
// dropped copy), the dot product in double.
void moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                          const float* expert_out, const float* weights, const int32_t* slot_of,
                          int64_t tokens, int64_t top_k, int64_t C);

}  // namespace lattice::kernels
