// PipelineExecutor: runs one pipeline rank's action list of a Schedule (schedule.hpp) on real
// model stages — forwards, backwards (whole, or split into B and W where the schedule says so) and
// non-blocking point-to-point transfers of activations and gradients between stages. The lists it
// runs are the ones the simulator replays and the checker proves (nothing is scheduled twice).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "lattice/comm/comm_handle.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::pipeline {

// One training step's microbatches: tokens and targets [B, T] each (read by the first and the
// last stage respectively; the same arrays on every pipeline rank).
struct Microbatches {
  std::vector<const int32_t*> tokens, targets;
  int64_t B = 0, T = 0;
};

class PipelineExecutor {
 public:
  // `stages`: this rank's virtual stages in increasing stage order (schedule.stage_owner names
  // them), each a Transformer holding that stage's blocks (StageRange) and, on the first and last
  // stage, the embedding and the head. `pp`: the pipeline communicator (its ranks are the
  // schedule's). The schedule is checked first (require_valid_schedule).
  PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                   std::vector<model::Transformer*> stages);

  // Runs this rank's actions for one step: every microbatch's loss scaled by 1/m, the parameter
  // gradients accumulated into the stages' stores (as m accumulation steps on one rank). Returns
  // the sum over microbatches of their mean losses on the rank holding the last stage, else 0.
  // A (stage, microbatch)'s activations are freed as soon as the schedule is done with them: after
  // its backward (its W when split) and the hand-over of its input gradient.
  double run_step(const model::LayerContext& ctx, const Microbatches& batches);
  // The most (stage, microbatch) activation sets this rank held at once in the last step: forwarded
  // and not yet freed (the schedule's in-flight count).
  int peak_in_flight() const { return peak_in_flight_; }

  const Schedule& schedule() const { return schedule_; }

 private:
  // The activations of (virtual stage, microbatch) while in flight, and what it received.
  struct InFlight {
    model::StageActivations saved;
    Tensor hidden_in;     // the input activations (stages after the first)
    Tensor d_hidden_out;  // the output gradient (stages before the last)
    comm::CommHandle hidden_in_arrival, gradient_arrival;
    std::vector<comm::CommHandle> sends;  // of its output and its input gradient
    bool backward_done = false, weight_done = false;
    bool gradient_handed_over = false;  // sent, or read by this rank's previous stage (or none)
  };
  // Frees (stage, microbatch)'s set once it is done (its sends finished first); true if freed.
  bool release_if_done(int virtual_stage, int microbatch);
  model::Transformer& stage(int virtual_stage);
  bool owns(int virtual_stage) const;
  InFlight& in_flight(int virtual_stage, int microbatch);
  // A message tag unique to the transfer's direction, stage and microbatch.
  int tag(bool backward, int virtual_stage, int microbatch) const;

  Schedule schedule_;
  comm::Communicator& pp_;
  int rank_ = 0;
  std::map<int, model::Transformer*> stages_;  // virtual stage -> its model
  std::map<std::pair<int, int>, InFlight> in_flight_;
  int peak_in_flight_ = 0;
};

}  // namespace lattice::pipeline
