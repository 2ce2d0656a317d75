// context_parallel.mode and its checks: see context_parallel_mode.hpp.
#include "lattice/parallel/context/context_parallel_mode.hpp"

#include "lattice/core/error.hpp"
#include "lattice/parallel/context/ring_attention.hpp"
#include "lattice/parallel/context/sequence_split.hpp"
#include "lattice/parallel/context/ulysses_attention.hpp"

namespace lattice::parallel {

ContextParallelMode parse_context_parallel_mode(const std::string& name) {
  if (name == "ring") return ContextParallelMode::ring;
  if (name == "ulysses") return ContextParallelMode::ulysses;
  throw Error("context_parallel.mode = \"" + name +
              "\" is not a mode: use \"ring\" or \"ulysses\"");
}

const char* context_parallel_mode_name(ContextParallelMode mode) {
  return mode == ContextParallelMode::ring ? "ring" : "ulysses";
}

std::unique_ptr<model::ContextAttention> make_context_attention(ContextParallelMode mode,
                                                                comm::Communicator& cp,
                                                                DeviceMemory& memory,
                                                                MemoryTracker* tracker) {
  if (mode == ContextParallelMode::ulysses)
    return std::make_unique<UlyssesAttention>(cp, memory, tracker);
  return std::make_unique<RingAttention>(cp, memory, tracker);
}

void check_context_parallel(ContextParallelMode mode, int cp, int tp, int64_t seq_len,
                            int64_t q_heads, int64_t kv_heads) {
  if (cp <= 1) return;
  check_context_split(seq_len, cp);
  if (mode != ContextParallelMode::ulysses) return;
  const int64_t q = q_heads / tp, kv = kv_heads / tp;
  check(q % cp == 0 && kv % cp == 0,
        "context_parallel.mode = \"ulysses\" splits the attention heads over parallelism.cp = " +
            std::to_string(cp) + " ranks, but each tensor-parallel rank holds " +
            std::to_string(q) + " query and " + std::to_string(kv) +
            " key/value heads, not divisible by cp: use context_parallel.mode = \"ring\" or a cp "
            "dividing both");
}

}  // namespace lattice::parallel
