// Ring algorithms over a Transport: allreduce (reduce-scatter then all-gather, 2(n-1)/n of the data
// per rank), reduce-scatter and all-gather with equal or variable blocks.
#pragma once

#include <cstdint>
#include <span>

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

// out = reduction of every rank's `in` (count elements; in may equal out).
void ring_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op);
// in holds size() blocks of `block_count`; out (block_count) receives the reduction of block
// rank().
void ring_reduce_scatter(Transport& transport, const void* in, void* out, int64_t block_count,
                         DType dtype, ReduceOp op);
// out holds the blocks of every rank in rank order, block r having counts[r] elements; `in` is this
// rank's block (counts[rank()] elements; it may already sit at its place in out).
void ring_all_gather(Transport& transport, const void* in, void* out,
                     std::span<const int64_t> counts, DType dtype);

}  // namespace lattice::comm
