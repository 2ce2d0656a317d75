// A step's communication time, one field per family: data parallelism's collectives (the part the
// training thread waited for, and the time they ran), tensor parallelism's blocking collectives,
// context parallelism's waits on the cp group, expert parallelism's token exchanges and pipeline
// parallelism's point-to-point waits. The trainer keeps it per step, summed over the steps since
// the printed line (their mean on the line) and over the run (TrainResult). Beside it: which
// families a layout has, and the clocks the model's tp and ep groups add their time to.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/mesh/mesh_shape.hpp"

namespace lattice::model {
class ContextAttention;
}

namespace lattice::train {

struct CommunicationTimes {
  double dp_exposed_seconds = 0;  // data parallelism: what the training thread waited for
  double dp_seconds = 0;          // ... and the time its collectives ran (overlapped or not)
  double tp_seconds = 0;          // tensor parallelism: this rank's blocking tp collectives
  double cp_seconds = 0;          // context parallelism: this rank's waits on its cp group
  double ep_seconds = 0;          // expert parallelism: this rank's MoE token exchanges
  double pp_wait_seconds = 0;     // pipeline parallelism: exposed point-to-point waits

  CommunicationTimes& operator+=(const CommunicationTimes& other);
  // Every family divided by `steps`: a sum over that many steps as the mean step's.
  CommunicationTimes mean(int64_t steps) const;
};

// The families a layout has: those of its axes of more than one rank (data parallelism's batch
// group is dp x cp). The metrics print and record only these.
struct CommunicationFamilies {
  bool dp = false, tp = false, cp = false, ep = false, pp = false;
  static CommunicationFamilies of(const mesh::MeshShape& shape);
};

// Where the model's own communication of a step is measured: the tensor- and expert-parallel
// groups add their blocking seconds to tp_seconds and ep_seconds (model::TensorParallelGroup's and
// model::ExpertParallelGroup's comm_seconds point here), and the context-parallel attention keeps
// its waits itself.
struct CommunicationClocks {
  double tp_seconds = 0, ep_seconds = 0;
  model::ContextAttention* context = nullptr;  // null without context parallelism
  // Zeroes the clocks: what validation or a checkpoint ran since the last step is not the step's.
  void start_step();
  // The step's tp, cp and ep seconds, written into `times`.
  void finish_step(CommunicationTimes& times);
};

// DiLoCo's exchanges between replica groups (diloco_sync.hpp) as of a step: the outer steps so far,
// this rank's bytes sent to the other groups so far, and the step's own outer exchange (0 when
// the step had none): its bytes and its seconds.
struct ReplicaExchange {
  int64_t outer_steps = 0, bytes_sent = 0, step_bytes = 0;
  double outer_seconds = 0;
  // At the end of a round: the bytes its exchange (and any hand-over) sent from this rank, the
  // most any round has, and the bandwidth that carries that round within the compute it can hide
  // behind (τ inner steps with overlap, one without) at the group's mean step time so far.
  int64_t round_bytes = 0, peak_round_bytes = 0;
  double peak_gbps = 0;
  // With a quorum (replica.groups > 1), at an outer step: its groups (and those that brought
  // trained parameters or gradients), the data block this group
  // brought back (-1: none, it joined) and the one it trains next, whether it took the job's state
  // from another group, and an FNV-1a hash of this rank's parameters after the step.
  std::vector<int> members, contributors;
  std::vector<int64_t> completed;  // the blocks every contributor brought back
  int64_t completed_block = -1, next_block = -1;
  bool joined = false;
  uint64_t weights_hash = 0;
};

}  // namespace lattice::train
