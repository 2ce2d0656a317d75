// Expert parallelism's token exchange for one MoE layer (Megatron-LM's all-to-all token
// dispatcher; GShard's dispatch and combine). The E experts are split over the P ranks of an
// expert-parallel group, rank r holding experts [r·E/P, (r+1)·E/P) (its L = E/P local experts).
// Each rank routes its own tokens (kernels/moe_dispatch.hpp: copies sorted by expert, so the
// copies for rank q's experts are one contiguous block); the exchange then sends each block to its
// rank with an all-to-all of variable counts, and on the receiving side reorders the rows from
// source-major (rank s's copies, by expert) to expert-major (local expert j's copies, by source
// rank) so that each local expert's GEMM reads one block. The return trip (the experts' outputs in
// forward, their input gradients in backward) is the inverse. Each row's arithmetic is the
// one-rank layer's: only where rows are computed changes.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/kernels/moe_dispatch.hpp"
#include "lattice/kernels/ops.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::model {

struct ExpertParallelGroup {
  comm::Communicator* comm = nullptr;  // null means size 1
  int rank = 0;
  int size = 1;
  // When set, every exchange (its counts and rows, forward and backward) adds its wall time
  // (seconds) here: the training line's "ep comm" (blocking, so all of it exposed). Owned by the
  // caller, one per rank.
  double* comm_seconds = nullptr;

  // This rank's experts of `experts`: [first_expert, first_expert + local_experts).
  int64_t local_experts(int64_t experts) const { return experts / size; }
  int64_t first_expert(int64_t experts) const { return rank * local_experts(experts); }
};

// One forward's exchange plan (kept for the backward, which moves gradients the same way).
struct ExpertExchange {
  int64_t local_experts = 0;
  std::vector<int64_t> send_rows;       // [P] copies sent to each rank
  std::vector<int64_t> recv_rows;       // [P] copies received from each rank
  std::vector<int64_t> recv_counts;     // [P x L] copies of local expert j from rank s (s-major)
  std::vector<int64_t> expert_offsets;  // [L + 1] local expert j's rows in expert-major order

  int64_t received() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
  int64_t expert_rows(int64_t j) const { return expert_offsets[j + 1] - expert_offsets[j]; }
};

// Collective over the group: every rank sends each rank how many of its copies go to each of that
// rank's experts (one all-to-all of L counts per rank). Throws when E is not divisible by P.
ExpertExchange plan_expert_exchange(const ExpertParallelGroup& ep,
                                    const kernels::MoeDispatch& dispatch);

// Collective: the copies in slot order (slot_rows [S, C], the dispatch's order) to the ranks of
// their experts; this rank's received copies land in expert_rows [received, C], expert-major.
void send_to_experts(const ExpertParallelGroup& ep, const ExpertExchange& plan, kernels::Ops& ops,
                     float* expert_rows, const float* slot_rows, int64_t C);
// Collective, the inverse: rows computed for the received copies (expert_rows, expert-major) back
// to the ranks they came from, into slot_rows [S, C] in slot order.
void return_from_experts(const ExpertParallelGroup& ep, const ExpertExchange& plan,
                         kernels::Ops& ops, float* slot_rows, const float* expert_rows, int64_t C);

}  // namespace lattice::model
