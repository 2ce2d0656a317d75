// Direct shared-memory algorithms for ranks that share an address space: every rank publishes its
// buffers, then reads and writes its peers' buffers in place. An allreduce reads and writes each
// byte once per rank: rank r reduces slice r of all inputs and stores it into all outputs.
#pragma once

#include <cstdint>

#include "lattice/comm/collective_call.hpp"

namespace lattice::comm {

// What one rank publishes for a direct collective.
struct DirectBuffers {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  const int64_t* counts = nullptr;  // the call's counts (all_gather_v, all_to_all_v send counts)
};

// The meeting point of ranks sharing an address space.
class SharedAddressSpace {
 public:
  virtual ~SharedAddressSpace() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Publishes this rank's buffers (returns at once: work that needs no peer can run while the
  // publication travels), then await_published() returns once every rank has published its own
  // and checks that all ranks entered the same collective.
  virtual void publish(const DirectBuffers& mine) = 0;
  virtual void await_published() = 0;
  virtual const DirectBuffers& peer(int rank) const = 0;
  // Returns once every rank has reached this point (peers' buffers may not be touched after it).
  virtual void sync() = 0;
  // Small-message path with a single synchronisation: copies `bytes` of `data` into this rank's
  // staging area, publishes it and waits for every rank (then checks they entered the same
  // collective); peer_staged(r) is rank r's copy, valid until this rank's next collective ends.
  virtual size_t staging_capacity() const = 0;
  virtual void exchange_staged(const void* data, size_t bytes) = 0;
  virtual const void* peer_staged(int rank) const = 0;
};

// Runs `call` (any collective op) with the direct algorithm.
void run_direct(SharedAddressSpace& space, const CollectiveCall& call);

}  // namespace lattice::comm
