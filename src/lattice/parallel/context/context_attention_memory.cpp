// Context-parallel attention's transient bytes: see context_attention_memory.hpp.
#include "lattice/parallel/context/context_attention_memory.hpp"

namespace lattice::parallel {

int64_t context_attention_transient_bytes(ContextParallelMode mode, int64_t B, int64_t local_len,
                                          int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                          bool widened_qkv) {
  const int64_t rows = B * local_len, q = rows * q_heads * head_dim;
  const int64_t kv = rows * kv_heads * head_dim, lse = rows * q_heads;
  int64_t floats = 0;
  // The workspace's slots at their largest (ContextWorkspace: kept from call to call).
  if (mode == ContextParallelMode::ring) {
    // Two [k | v] blocks in flight, one call's gradients, the arriving sum and two outgoing sums
    // (6 blocks of 2·kv); each query run's out, d_out and lse copies; one forward call's out and
    // lse (a run's: half the rows).
    floats = 6 * 2 * kv + 2 * q + lse + q / 2 + lse / 2;
  } else {
    // q, out, d_out, dq over the head shard (each rank's q size), k, v, dk, dv and the lse; the
    // all-to-alls' send and receive buffers (at most q each).
    floats = 4 * q + 4 * kv + lse + 2 * q;
  }
  if (widened_qkv) floats += 2 * (q + 2 * kv);
  return floats * 4;
}

}  // namespace lattice::parallel
