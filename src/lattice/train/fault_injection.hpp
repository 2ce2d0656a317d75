// FaultInjection: faults a test installs in a run (Trainer's constructor, train_on_ranks) to show
// that the run's failure handling works — a rank killed (SIGKILL) after a step (its peers' watchdog
// or the launcher names it; the last checkpoint resumes), a rank stalled before a step (a hung
// stage: its peers' watchdogs name it), a rank killed halfway through writing its files of a
// checkpoint (the previous one stays the latest). The default injects nothing; nothing reads the
// environment. Tests install it through tests/parallel/fault_runner/.
#pragma once

#include <cstdint>

namespace lattice::train {

struct FaultInjection {
  // A world rank at a step; never when rank < 0.
  struct At {
    int rank = -1;
    int64_t step = -1;
    bool hits(int world_rank, int64_t at_step) const {
      return rank >= 0 && rank == world_rank && step == at_step;
    }
  };
  At kill_after_step;    // dies once the step has run, before its metrics are written
  At stall_before_step;  // sleeps stall_seconds before the step
  double stall_seconds = 5;
  At kill_during_save;  // dies after its weights file of the step's checkpoint, before its moments

  // The trainer's calls, on every rank: the stall, then the kill.
  void before_step(int world_rank, int64_t step) const;
  void after_step(int world_rank, int64_t step) const;
};

}  // namespace lattice::train
