// CommOptions: the knobs of a communicator (watchdog timeout, forced algorithms, tree chunk size,
// descriptor verification, emulated nodes), with overrides from LATTICE_COMM_* environment
// variables.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

#include "lattice/comm/algorithm.hpp"

namespace lattice::comm {

struct CommOptions {
  // A wait without progress for this long becomes an Error naming the ranks that did not arrive.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Per collective op (indexed by CollectiveOp): automatic, or the algorithm to force.
  std::array<Algorithm, kCollectiveOpCount> algorithms{};
  // Pipelining unit of the tree algorithms.
  int64_t tree_chunk_bytes = int64_t{128} << 10;
  // MPI: check before each collective (one small allreduce) that all ranks entered the same one.
  bool verify_collectives = true;
  // > 0: emulate nodes of this many consecutive ranks (hierarchical collectives, tests); 0: use the
  // launcher's node layout (every rank on one node for the local backend).
  int ranks_per_node = 0;

  void force(CollectiveOp op, Algorithm algorithm) {
    algorithms[static_cast<size_t>(op)] = algorithm;
  }
  Algorithm forced(CollectiveOp op) const { return algorithms[static_cast<size_t>(op)]; }
};

// Applies LATTICE_COMM_TIMEOUT_MS, LATTICE_COMM_ALGORITHM (all ops; "op=name,op=name" per op),
// LATTICE_COMM_VERIFY (0/1) and LATTICE_COMM_RANKS_PER_NODE from the environment when set.
CommOptions options_from_environment(CommOptions base = {});

}  // namespace lattice::comm
