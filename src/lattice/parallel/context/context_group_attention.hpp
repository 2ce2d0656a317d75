// What ring attention and Ulysses share: the cp group the sequence is split over, its causal
// load-balanced runs (sequence_split.hpp), the workspace kept from call to call, and the clock of
// the time spent waiting on the group (the training line's "cp comm").
#pragma once

#include <chrono>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/model/context_parallel.hpp"
#include "lattice/parallel/context/row_copies.hpp"

namespace lattice::parallel {

class ContextGroupAttention : public model::ContextAttention {
 public:
  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  std::vector<model::PositionRun> runs(int64_t local_len) const override;
  double take_wait_seconds() override;

 protected:
  // `cp`: the context-parallel group (Mesh::group(Axis::cp)); it must outlive this object. The
  // workspace's buffers live in `memory` (the backend's: kernels::Ops::memory()) and are counted
  // in `tracker` (may be null) as activations.
  ContextGroupAttention(comm::Communicator& cp, DeviceMemory& memory, MemoryTracker* tracker)
      : cp_(cp), workspace_(memory, tracker) {}

  // Runs `blocking` (a wait, or a blocking collective) and adds its time to the waits.
  template <class Blocking>
  void waited(Blocking&& blocking) {
    const auto start = std::chrono::steady_clock::now();
    blocking();
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  comm::Communicator& cp_;
  ContextWorkspace workspace_;

 private:
  double wait_seconds_ = 0;
};

}  // namespace lattice::parallel
