// Element-wise reduction and copy kernels the collective algorithms run on their slices: any number
// of sources reduced into any number of targets in one pass, fp32 accumulation for bf16/fp16,
// streaming (non-temporal) stores for large outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/dtype.hpp"

namespace lattice::comm {

// True for the element types collectives accept (fp32, bf16, fp16, int32, int64).
bool is_collective_dtype(DType dtype);

// targets[t][i] = sources[0][i] op sources[1][i] op ... op sources[n-1][i], for every target t,
// with the sources combined in the order given. bf16 and fp16 are accumulated in fp32 and rounded
// once. When `average_divisor` > 0 the combined value is divided by it before the store
// (ReduceOp::avg's final step); ReduceOp::avg itself combines as a sum. A target may alias a source
// element for element.
void reduce_into_targets(const void* const* sources, int source_count, void* const* targets,
                         int target_count, int64_t count, DType dtype, ReduceOp op,
                         int average_divisor = 0);

// acc[i] = local[i] op other[i] (local may be acc); divides by `average_divisor` when it is > 0.
void reduce_pair(void* acc, const void* local, const void* other, int64_t count, DType dtype,
                 ReduceOp op, int average_divisor = 0);

// buffer[i] /= divisor (integers truncate toward zero); used to finish ReduceOp::avg.
void divide_in_place(void* buffer, int64_t count, DType dtype, int divisor);

// memcpy that uses non-temporal stores for large copies (the target is not read back soon).
void copy_bytes(void* target, const void* source, size_t bytes);

// Outputs of at least this many bytes per kernel call are written with non-temporal stores.
// Measured on the development machine (large L3), plain stores win up to 256 MiB collectives, so
// only outputs beyond 1 GiB stream.
inline constexpr size_t kStreamingStoreBytes = size_t{1} << 30;
// copy_bytes streams from this size on.
inline constexpr size_t kStreamingCopyBytes = size_t{4} << 20;

}  // namespace lattice::comm
