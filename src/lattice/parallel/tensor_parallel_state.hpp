// Tensor-parallel state as logical tensors: a tensor-parallel group's ranks each hold slices of
// some parameters (model::TensorShard, not replicated over mesh::Axis::tp) and whole copies of the
// rest. gather_logical assembles the logical tensors of any buffer laid out as the slice store's
// values (values, gradients, AdamW moments) into a buffer laid out as the logical store's (the
// tp = 1 model: the same names, every parameter whole), on tensor-parallel rank 0; scatter_logical
// gives each rank its slices of a logical buffer it holds. What checkpoints (logical, so a one-rank
// run reads a tensor-parallel run's), parity checks and resharding use.
#pragma once

#include "lattice/comm/communicator.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::parallel {

// True when `info` is one slice of a tensor split over the tensor-parallel axis (a shard count
// above 1 and not replicated over tp).
bool is_tensor_parallel_slice(const model::ParameterInfo& info);
// True when any parameter of `store` is such a slice.
bool has_tensor_parallel_slices(const model::ParameterStore& store);

// Checks that `logical` holds the logical tensors of `local`: the same parameter names, each whole
// with `local`'s logical shape (global_shape). Throws lattice::Error naming the first difference.
void check_logical_store(const model::ParameterStore& local, const model::ParameterStore& logical);

// One parameter: copies the slice `slice` describes from its local tensor into its place in the
// logical tensor (row-major, slice.global_shape), or takes it out. A whole parameter is a copy.
void place_slice(const model::ParameterInfo& slice, const float* local, float* logical);
void take_slice(const model::ParameterInfo& slice, const float* logical, float* local);

// Collective over `tp` (every rank of the group calls it with stores of one layout, rank r holding
// slice r of each tensor-parallel slice): fills `logical_flat`, laid out as `logical`'s values, on
// tp rank 0 with each logical tensor assembled from the ranks' slices of `local_flat` (laid out as
// `local`'s values); parameters whole in `local` are copied from rank 0's buffer. `logical_flat`
// is not touched on the other ranks (it may be null there), nor are the flat buffer's alignment
// gaps. The slices travel to rank 0 one parameter per message, so no rank holds more than its own
// buffer beside the logical one. Layouts that differ across the ranks, a slice not matching its
// rank, or a `logical` that fails check_logical_store throw lattice::Error on every rank (no rank
// is left waiting).
void gather_logical(const model::ParameterStore& local, const float* local_flat,
                    const model::ParameterStore& logical, float* logical_flat,
                    comm::Communicator& tp);

// The reverse, on one rank and without communication: fills `local_flat` (laid out as `local`'s
// values) with this rank's slices (info.shard.index) of `logical_flat` (laid out as `logical`'s
// values); whole parameters are copied. Throws lattice::Error when check_logical_store fails.
void scatter_logical(const model::ParameterStore& logical, const float* logical_flat,
                     const model::ParameterStore& local, float* local_flat);

}  // namespace lattice::parallel
