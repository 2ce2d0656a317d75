// Algorithm: which implementation a collective runs (ring, tree, halving-doubling, direct shared
// memory, pairwise, hierarchical, or the backend's native one), its names, and the automatic
// selection rule.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lattice/comm/collective.hpp"

namespace lattice::comm {

enum class Algorithm : uint8_t {
  automatic,         // chosen per call by select_algorithm()
  ring,              // ring reduce-scatter + all-gather; ring all-gather / reduce-scatter
  tree,              // pipelined chunked binary tree (allreduce, broadcast, reduce)
  halving_doubling,  // recursive halving reduce-scatter + recursive doubling all-gather (allreduce)
  direct,            // peers' buffers read and written directly (ranks sharing an address space)
  pairwise,          // pairwise exchange all-to-all
  hierarchical,  // reduce inside each node, allreduce across nodes, broadcast inside (allreduce)
  native,        // the backend's own collective (MPI's or NCCL's)
};
inline constexpr int kAlgorithmCount = 8;

constexpr std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::ring:
      return "ring";
    case Algorithm::tree:
      return "tree";
    case Algorithm::halving_doubling:
      return "halving_doubling";
    case Algorithm::direct:
      return "direct";
    case Algorithm::pairwise:
      return "pairwise";
    case Algorithm::hierarchical:
      return "hierarchical";
    case Algorithm::native:
      return "native";
  }
  return "?";
}

// Parses a name printed by algorithm_name(); throws Error listing the valid names otherwise.
Algorithm parse_algorithm(std::string_view name);

// True when `algorithm` implements `op` (automatic implements everything).
bool algorithm_supports(Algorithm algorithm, CollectiveOp op);

// What the backend offers the selection rule.
struct AlgorithmCapabilities {
  bool shared_address_space = false;  // the direct algorithm can run
  bool native = false;                // the backend has its own collectives
  bool prefer_native = false;         // use native ones when nothing is forced
};

// The automatic choice for `op` moving `bytes` per rank over `ranks` ranks: direct when ranks share
// an address space; otherwise native when preferred; otherwise halving-doubling for small
// allreduces, tree for broadcast/reduce, ring for large allreduces and the gather/scatter family,
// pairwise all-to-all.
Algorithm select_algorithm(CollectiveOp op, int64_t bytes, int ranks,
                           const AlgorithmCapabilities& capabilities);

}  // namespace lattice::comm
