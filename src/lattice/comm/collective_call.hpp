// CollectiveCall: one validated collective as a backend executes it (descriptor, resolved
// algorithm, buffers and, for the _v forms, the per-rank counts).
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/comm/algorithm.hpp"
#include "lattice/comm/collective.hpp"

namespace lattice::comm {

struct CollectiveCall {
  CollectiveDescriptor descriptor;
  Algorithm algorithm = Algorithm::automatic;
  const void* in = nullptr;  // broadcast: the buffer (in == out)
  void* out = nullptr;
  // all_gather_v: elements from each rank; all_to_all_v: elements this rank sends to each rank.
  std::vector<int64_t> counts;
  // all_to_all_v: elements this rank receives from each rank.
  std::vector<int64_t> recv_counts;

  int64_t count() const { return descriptor.count; }
  DType dtype() const { return descriptor.dtype; }
};

}  // namespace lattice::comm
