// Pipelined binary-tree algorithms over a Transport: the data is cut into chunks that flow up a
// binary tree rooted at `root` (reduce) and down it (broadcast), so all tree levels work at once;
// allreduce is a tree reduce followed by a tree broadcast.
#pragma once

#include <cstdint>

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

// out (significant at the root only) = reduction of every rank's `in`. Other ranks may pass
// nullptr; a non-null `out` on them is used as scratch.
void tree_reduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                 ReduceOp op, int root, int64_t chunk_bytes);
// Every rank's buffer receives the root's.
void tree_broadcast(Transport& transport, void* buffer, int64_t count, DType dtype, int root,
                    int64_t chunk_bytes);
void tree_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op, int64_t chunk_bytes);

}  // namespace lattice::comm
