// PipelineExecutor: runs one pipeline rank's action list of a Schedule (schedule.hpp) on real
// model stages — forwards, backwards (whole, or split into B and W where the schedule says so) and
// non-blocking point-to-point transfers of activations and gradients between stages. The lists it
// runs are the ones the simulator replays and the checker proves (nothing is scheduled twice).
// Every action is timed (StepTimeline), so the measured bubble and the exposed point-to-point time
// come from the step itself, in the replay's form (a timeline per rank).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lattice/comm/comm_handle.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/pipeline/replay.hpp"
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

// One virtual stage of this rank: its model and the hooks its forward and backward call (data
// parallelism's gradient buckets, per stage; null: none).
struct PipelineStage {
  model::Transformer* model = nullptr;
  model::ModelHooks* hooks = nullptr;
};

// Where the time of one step went on this rank (seconds): its actions as they ran (compute
// actions from start to end; a receive from the moment its data was first needed to its arrival,
// so its length is the exposed wait), and the totals.
struct StepTimeline {
  std::vector<TimedAction> actions;  // times since the step began (sends: their posting)
  int64_t start_ns = 0;              // when the step began (steady clock, ns)
  double seconds = 0;                // the whole step on this rank
  double compute_seconds = 0;        // F, B and W
  double wait_seconds = 0;           // waiting for activations and gradients to arrive
  double send_wait_seconds = 0;      // waiting at the step's end for the last sends to complete
  // Not waiting: the compute and what runs between the actions (posting transfers, freeing sets).
  double busy_seconds() const { return seconds - wait_seconds - send_wait_seconds; }
};

class PipelineExecutor {
 public:
  // `stages`: this rank's virtual stages in increasing stage order (schedule.stage_owner names
  // them), each a Transformer holding that stage's blocks (StageRange) and, on the first and last
  // stage, the embedding and the head. `pp`: the pipeline communicator (its ranks are the
  // schedule's). The schedule is checked first (require_valid_schedule).
  PipelineExecutor(Schedule schedule, comm::Communicator& pp, std::vector<PipelineStage> stages);
  PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                   std::vector<model::Transformer*> stages);

  // Called right before the action that completes a virtual stage's gradients in each step (its
  // last B, or its last W when the schedule splits them): data parallelism starts its bucket
  // reductions during that action's backward.
  std::function<void(int virtual_stage)> before_final_backward;

  // Runs this rank's actions for one step: every microbatch's loss scaled by 1/m, the parameter
  // gradients accumulated into the stages' stores (as m accumulation steps on one rank). Returns
  // the sum over microbatches of their mean losses on the rank holding the last stage, else 0.
  // A (stage, microbatch)'s activations are freed as soon as the schedule is done with them: after
  // its backward (its W when split) and the hand-over of its input gradient. `ctx.hooks` is
  // replaced by each stage's own.
  double run_step(const model::LayerContext& ctx, const Microbatches& batches);
  // The most (stage, microbatch) activation sets this rank held at once in the last step: forwarded
  // and not yet freed (the schedule's in-flight count).
  int peak_in_flight() const { return peak_in_flight_; }
  // The last step's timeline on this rank.
  const StepTimeline& timeline() const { return timeline_; }

  // Forward only through every stage, one [B, T] batch (validation): the mean loss, on every
  // pipeline rank (sent from the last stage's). Collective over the pipeline group.
  double evaluate(const model::LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                  int64_t B, int64_t T);

  const Schedule& schedule() const { return schedule_; }
  // The rank holding the last virtual stage (the loss).
  int last_stage_rank() const { return schedule_.stage_owner.back(); }

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
  // Releases (stage, microbatch)'s set once it is done; true if released. It is freed at once when
  // its sends are complete, else it drains (draining_) until they are.
  bool release_if_done(int virtual_stage, int microbatch);
  // Frees the drained sets whose sends are complete (with `wait`: waits for all of them first).
  void free_drained_sets(bool wait);
  // What a compute action reads from its neighbouring stage: the previous stage's output (F) or
  // the next stage's input gradient (`backward`: B). In memory when this rank holds that stage
  // too, else the receive's buffer once it arrived.
  const float* neighbour_data(const Action& action, bool backward);
  // Waits for a receive, timing the wait as `action` and naming it if the peer never sends.
  void wait_for(comm::CommHandle& arrival, const Action& action);
  double now() const;  // seconds since the step began
  model::Transformer& stage(int virtual_stage);
  const PipelineStage& stage_entry(int virtual_stage) const;
  bool owns(int virtual_stage) const;
  InFlight& in_flight(int virtual_stage, int microbatch);
  // A message tag unique to the transfer's direction, stage and microbatch.
  int tag(bool backward, int virtual_stage, int microbatch) const;

  Schedule schedule_;
  comm::Communicator& pp_;
  int rank_ = 0;
  std::map<int, PipelineStage> stages_;  // virtual stage -> its model and hooks
  std::vector<bool> final_backward_;     // per action of this rank's list: completes a stage
  std::map<std::pair<int, int>, InFlight> in_flight_;
  std::vector<std::map<std::pair<int, int>, InFlight>::node_type> draining_;
  int peak_in_flight_ = 0;
  StepTimeline timeline_;
  int64_t step_start_ns_ = 0;
};

}  // namespace lattice::pipeline
