// Where a mixture-of-experts layer's token copies go: from each token's top-k choice (the
// router's experts [tokens, top_k]), the expert-sorted order in which the expert GEMMs read them
// — expert e's copies are the contiguous slots [offsets[e], offsets[e + 1]), in token order — and,
// with a capacity, which copies are dropped (an expert keeps its first `capacity` copies in token
// order; a dropped copy adds nothing and its token passes through the residual). Host integer
// bookkeeping, the same for every backend (a device backend copies the indices over); the row
// moves themselves are kernels::Ops::moe_gather / moe_combine and their backwards.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::kernels {

struct MoeDispatch {
  int64_t tokens = 0, top_k = 0, experts = 0;
  std::vector<int64_t> offsets;     // [experts + 1]: expert e's slots [offsets[e], offsets[e+1])
  std::vector<int32_t> slot_token;  // [slots]: the token each slot's copy comes from
  std::vector<int32_t> slot_of;     // [tokens · top_k]: copy (t, k)'s slot, or -1 when dropped
  int64_t dropped = 0;              // copies dropped by the capacity
  int64_t slots() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t count(int64_t expert) const { return offsets[expert + 1] - offsets[expert]; }
};

// capacity < 0: dropless (every copy kept). Experts' ids must lie in [0, experts).
MoeDispatch plan_moe_dispatch(const int32_t* experts, int64_t tokens, int64_t top_k,
                              int64_t num_experts, int64_t capacity = -1);

// Switch/GShard's capacity per expert: ceil(factor · tokens · top_k / experts). factor must be
// positive.
int64_t moe_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts);

}  // namespace lattice::kernels
