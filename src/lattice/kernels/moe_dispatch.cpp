// The expert-sorted dispatch of a mixture-of-experts layer: see moe_dispatch.hpp.
#include "lattice/kernels/moe_dispatch.hpp"

#include <cmath>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

MoeDispatch plan_moe_dispatch(const int32_t* experts, int64_t tokens, int64_t top_k,
                              int64_t num_experts, int64_t capacity) {
  MoeDispatch d;
  d.tokens = tokens;
  d.top_k = top_k;
  d.experts = num_experts;
  const int64_t copies = tokens * top_k;
  // Each expert's kept copies, in token order (and choice order within a token).
  std::vector<int64_t> kept(static_cast<size_t>(num_experts), 0);
  d.slot_of.assign(static_cast<size_t>(copies), -1);
  std::vector<int64_t> rank_in_expert(static_cast<size_t>(copies), -1);
  for (int64_t c = 0; c < copies; ++c) {
    const int32_t e = experts[c];
    check(e >= 0 && e < num_experts, "moe dispatch: expert " + std::to_string(e) + " of token " +
                                         std::to_string(c / top_k) + " is outside [0, " +
                                         std::to_string(num_experts) + ")");
    if (capacity >= 0 && kept[e] >= capacity) {
      ++d.dropped;
      continue;
    }
    rank_in_expert[c] = kept[e]++;
  }
  d.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t e = 0; e < num_experts; ++e) d.offsets[e + 1] = d.offsets[e] + kept[e];
  d.slot_token.assign(static_cast<size_t>(d.offsets.back()), 0);
  for (int64_t c = 0; c < copies; ++c) {
    if (rank_in_expert[c] < 0) continue;
    const int64_t slot = d.offsets[experts[c]] + rank_in_expert[c];
    d.slot_of[c] = static_cast<int32_t>(slot);
    d.slot_token[slot] = static_cast<int32_t>(c / top_k);
  }
  return d;
}

int64_t moe_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts) {
  check(factor > 0, "moe capacity factor " + std::to_string(factor) +
                        " must be positive (or dropless: no capacity)");
  return static_cast<int64_t>(
      std::ceil(factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
}

}  // namespace lattice::kernels
