// The bytes a context-parallel attention's workspace holds (kept from call to call, at its largest
// in the backward), for the activation-memory estimate (`lattice estimate memory --config`): what
// ring_attention.cpp and ulysses_attention.cpp take, slot by slot; and GPT-2's bf16 widening
// around each call.
#pragma once

#include <cstdint>

#include "lattice/parallel/context/context_parallel_mode.hpp"

namespace lattice::parallel {

// B sequences of local_len rows on this rank, q_heads and kv_heads of head_dim (this tensor-
// parallel rank's); `widened_qkv`: the block hands bf16 q, k, v widened to fp32 (GPT-2 in bf16:
// the widened q, k, v and their fp32 gradients, [rows, q + 2·kv widths] each, live around it).
int64_t context_attention_transient_bytes(ContextParallelMode mode, int64_t B, int64_t local_len,
                                          int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                          bool widened_qkv);

}  // namespace lattice::parallel
