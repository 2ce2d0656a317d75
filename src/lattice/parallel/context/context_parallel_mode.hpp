// context_parallel.mode: how attention reaches the keys held by the other cp ranks — ring
// (ring_attention.hpp: key/value blocks travel around the ranks, any head count) or ulysses
// (ulysses_attention.hpp: all-to-all to head shards, heads divisible by cp) — and the checks that
// a model and sequence can be split that way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/model/context_parallel.hpp"

namespace lattice::parallel {

enum class ContextParallelMode { ring, ulysses };

// "ring" | "ulysses"; anything else throws naming both.
ContextParallelMode parse_context_parallel_mode(const std::string& name);
const char* context_parallel_mode_name(ContextParallelMode mode);

// The attention over `cp` (Mesh::group(Axis::cp), size > 1) for `mode`, its buffers in `memory`
// (the backend's: kernels::Ops::memory()).
std::unique_ptr<model::ContextAttention> make_context_attention(ContextParallelMode mode,
                                                                comm::Communicator& cp,
                                                                DeviceMemory& memory,
                                                                MemoryTracker* tracker);

// Throws lattice::Error (one line, with the fix) when a sequence of seq_len tokens cannot be split
// over cp ranks (2·cp chunks), or under ulysses when the q_heads / kv_heads heads each of the tp
// tensor-parallel ranks holds are not divisible by cp.
void check_context_parallel(ContextParallelMode mode, int cp, int tp, int64_t seq_len,
                            int64_t q_heads, int64_t kv_heads);

}  // namespace lattice::parallel
