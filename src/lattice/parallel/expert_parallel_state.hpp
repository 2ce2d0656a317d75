// Expert-parallel state as one whole model: each rank of an expert-parallel group holds the dense
// parameters and its own slice of every MoE layer's experts (placed on every axis but ep;
// model/moe_mlp.hpp). gather_experts assembles any buffer laid out as a rank's values (the values,
// AdamW moments) into the whole model's layout (the ep = 1 model: every expert) on the group's
// rank 0 — what the parity harness reads. Loading needs no counterpart: each rank
// reads its own experts by name from a checkpoint (train/checkpoint.hpp).
#pragma once

#include "lattice/comm/communicator.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::parallel {

// True when `info` is held by one expert-parallel rank alone (an expert's weight under ep > 1).
bool is_expert_parallel_slice(const model::ParameterInfo& info);

// Collective over `ep`: fills `whole_flat` (laid out as `whole`'s values) on ep rank 0 from every
// rank's `local_flat` (laid out as its `local`'s values): the dense parameters from rank 0's, each
// expert from the rank that holds it. `whole_flat` is ignored (may be null) on the other ranks.
// Throws lattice::Error on rank 0 when `whole` lacks a parameter a rank sends or when a parameter
// of `whole` is held by no rank.
void gather_experts(const model::ParameterStore& local, const float* local_flat,
                    const model::ParameterStore& whole, float* whole_flat, comm::Communicator& ep);

// Both splits at once: collective over `tp` (every rank of this rank's tensor-parallel group)
// and then, on tp rank 0, over `ep` (the tp-0 ranks of one expert-data-parallel index). The
// tensor-parallel slices are gathered into `tp_logical` (the store of this ep rank: the same
// experts, every tensor whole: model::Transformer::declared_only with tp = 1 and this ep rank),
// then the experts into `whole` (tp = 1, ep = 1) on tp rank 0 of ep rank 0. Either group may be
// of one rank.
void gather_model_state(const model::ParameterStore& local, const float* local_flat,
                        const model::ParameterStore& tp_logical, const model::ParameterStore& whole,
                        float* whole_flat, comm::Communicator& tp, comm::Communicator& ep);

}  // namespace lattice::parallel
