// PipelineExecutor: see executor.hpp.
#include "lattice/parallel/pipeline/executor.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"

namespace lattice::pipeline {

namespace {

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<PipelineStage> without_hooks(const std::vector<model::Transformer*>& models) {
  std::vector<PipelineStage> stages;
  for (model::Transformer* m : models) stages.push_back({m, nullptr});
  return stages;
}

}  // namespace

PipelineExecutor::PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                                   std::vector<model::Transformer*> stages)
    : PipelineExecutor(std::move(schedule), pp, without_hooks(stages)) {}

PipelineExecutor::PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                                   std::vector<PipelineStage> stages)
    : schedule_(std::move(schedule)), pp_(pp), rank_(pp.rank()) {
  require_valid_schedule(schedule_);
  check(pp.size() == schedule_.num_ranks,
        "the pipeline schedule is for " + std::to_string(schedule_.num_ranks) +
            " ranks but the pipeline group has " + std::to_string(pp.size()));
  size_t next = 0;
  for (int s = 0; s < schedule_.num_stages(); ++s) {
    if (schedule_.stage_owner[static_cast<size_t>(s)] != rank_) continue;
    check(next < stages.size(), "pipeline rank " + std::to_string(rank_) +
                                    " owns more virtual stages than the " +
                                    std::to_string(stages.size()) + " models it was given");
    stages_[s] = stages[next++];
  }
  check(next == stages.size(), "pipeline rank " + std::to_string(rank_) + " was given " +
                                   std::to_string(stages.size()) + " models for " +
                                   std::to_string(next) + " virtual stages");
  const int last = schedule_.num_stages() - 1;
  for (const auto& [s, entry] : stages_) {
    check(entry.model != nullptr, "pipeline stage " + std::to_string(s) + " has no model");
    check(entry.model->has_embedding() == (s == 0) && entry.model->has_head() == (s == last),
          "virtual stage " + std::to_string(s) + " of " + std::to_string(last + 1) +
              ": the embedding belongs on the first stage and the head on the last");
  }
  // The action that completes each stage's gradients: its last B, or its last W when split.
  const std::vector<Action>& mine = schedule_.actions[static_cast<size_t>(rank_)];
  final_backward_.assign(mine.size(), false);
  const ActionKind completing =
      schedule_.splits_weight_gradient ? ActionKind::kBackwardWeight : ActionKind::kBackward;
  std::map<int, size_t> last_of_stage;
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i].kind == completing) last_of_stage[mine[i].stage] = i;
  for (const auto& [s, i] : last_of_stage) final_backward_[i] = true;
}

bool PipelineExecutor::owns(int virtual_stage) const {
  return stages_.count(virtual_stage) != 0;
}

const PipelineStage& PipelineExecutor::stage_entry(int virtual_stage) const {
  const auto it = stages_.find(virtual_stage);
  check(it != stages_.end(), "pipeline rank " + std::to_string(rank_) + " does not own stage " +
                                 std::to_string(virtual_stage) + " (internal error)");
  return it->second;
}

model::Transformer& PipelineExecutor::stage(int virtual_stage) {
  return *stage_entry(virtual_stage).model;
}

PipelineExecutor::InFlight& PipelineExecutor::in_flight(int virtual_stage, int microbatch) {
  auto [it, fresh] = in_flight_.try_emplace({virtual_stage, microbatch});
  if (fresh) {
    it->second.saved = stage(virtual_stage).make_activations();
    it->second.gradient_handed_over = virtual_stage == 0;  // the first stage's goes nowhere
  }
  return it->second;
}

double PipelineExecutor::now() const {
  return static_cast<double>(clock_ns() - step_start_ns_) * 1e-9;
}

bool PipelineExecutor::release_if_done(int virtual_stage, int microbatch) {
  const auto it = in_flight_.find({virtual_stage, microbatch});
  if (it == in_flight_.end()) return false;
  InFlight& f = it->second;
  if (!(f.backward_done && f.weight_done && f.gradient_handed_over)) return false;
  // Its sends read its tensors. One still in flight is not waited for here: the schedule's proof
  // takes sends as non-blocking, and a send the peer receives only after one of this rank's later
  // actions (a rendezvous transfer) would deadlock. The set drains instead, freed once its sends
  // are done (at the latest at the end of the step).
  bool sent = true;
  for (comm::CommHandle& send : f.sends) sent = send.test() && sent;
  if (sent)
    in_flight_.erase(it);
  else
    draining_.push_back(in_flight_.extract(it));
  return true;
}

void PipelineExecutor::free_drained_sets(bool wait) {
  const double start = now();
  for (auto& node : draining_)
    for (comm::CommHandle& send : node.mapped().sends)
      if (wait) send.wait();
  std::erase_if(draining_, [&](auto& node) {
    return std::all_of(node.mapped().sends.begin(), node.mapped().sends.end(),
                       [](comm::CommHandle& send) { return send.test(); });
  });
  if (wait) timeline_.send_wait_seconds += now() - start;
}

void PipelineExecutor::wait_for(comm::CommHandle& arrival, const Action& action) {
  const double start = now();
  try {
    arrival.wait();
  } catch (const Error& e) {
    throw Error("pipeline rank " + std::to_string(rank_) + " waited in vain for " +
                describe(action) + ": " + e.what() +
                " (the rank holding that stage stalled or died)");
  }
  const double end = now();
  timeline_.actions.push_back({action, start, end});
  timeline_.wait_seconds += end - start;
}

const float* PipelineExecutor::neighbour_data(const Action& action, bool backward) {
  InFlight& f = in_flight(action.stage, action.microbatch);
  const int neighbour = action.stage + (backward ? 1 : -1);
  const float* data = nullptr;
  if (owns(neighbour)) {  // interleaved and V schedules: handed over in memory
    const model::StageActivations& theirs = in_flight(neighbour, action.microbatch).saved;
    data = backward ? theirs.d_hidden_in() : theirs.hidden_out();
  } else {
    wait_for(backward ? f.gradient_arrival : f.hidden_in_arrival,
             {backward ? ActionKind::kRecvBackward : ActionKind::kRecvForward, action.stage,
              action.microbatch, schedule_.stage_owner[static_cast<size_t>(neighbour)]});
    data = (backward ? f.d_hidden_out : f.hidden_in).f32();
  }
  check(data != nullptr, describe(action) + " on pipeline rank " + std::to_string(rank_) +
                             (backward ? " before its output gradient" : " before its input") +
                             " arrived (schedule error)");
  return data;
}

int PipelineExecutor::tag(bool backward, int virtual_stage, int microbatch) const {
  return ((backward ? 1 : 0) * schedule_.num_stages() + virtual_stage) *
             schedule_.num_microbatches +
         microbatch;
}

double PipelineExecutor::run_step(const model::LayerContext& ctx, const Microbatches& batches) {
  const int m = schedule_.num_microbatches;
  check(
      static_cast<int>(batches.tokens.size()) == m && static_cast<int>(batches.targets.size()) == m,
      "the pipeline step needs " + std::to_string(m) + " microbatches, got " +
          std::to_string(batches.tokens.size()));
  const int64_t B = batches.B, T = batches.T;
  const int last = schedule_.num_stages() - 1;
  const float loss_scale = 1.0f / static_cast<float>(m);
  double loss = 0;
  peak_in_flight_ = 0;
  timeline_ = {};
  step_start_ns_ = clock_ns();
  timeline_.start_ns = step_start_ns_;
  int forwarded_sets = 0;  // forwarded and not yet freed (every freed set was forwarded)
  const std::vector<Action>& actions = schedule_.actions[static_cast<size_t>(rank_)];
  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& action = actions[index];
    const PipelineStage& entry = stage_entry(action.stage);
    model::Transformer& model = *entry.model;
    model::LayerContext stage_ctx = ctx;
    stage_ctx.hooks = entry.hooks;
    const int64_t elements = model.tensor_parallel().local_rows(B * T) * model.config().d_model;
    InFlight& f = in_flight(action.stage, action.microbatch);
    const auto mb = static_cast<size_t>(action.microbatch);
    if (final_backward_[index] && before_final_backward) before_final_backward(action.stage);
    double compute_start = now();  // compute actions restart it after their input arrived
    switch (action.kind) {
      case ActionKind::kForward: {
        const float* hidden_in = action.stage > 0 ? neighbour_data(action, false) : nullptr;
        compute_start = now();
        const float mean = model.forward_stage(
            stage_ctx, f.saved, action.stage == 0 ? batches.tokens[mb] : nullptr, hidden_in,
            action.stage == last ? batches.targets[mb] : nullptr, B, T, loss_scale);
        if (action.stage == last) loss += mean;
        peak_in_flight_ = std::max(peak_in_flight_, ++forwarded_sets);
        break;
      }
      case ActionKind::kBackward: {
        const float* d_hidden_out = action.stage < last ? neighbour_data(action, true) : nullptr;
        compute_start = now();
        if (schedule_.splits_weight_gradient)
          model.backward_stage_input(stage_ctx, f.saved, d_hidden_out);
        else
          model.backward_stage(stage_ctx, f.saved, d_hidden_out);
        f.backward_done = true;
        f.weight_done = !schedule_.splits_weight_gradient;
        if (action.stage < last && owns(action.stage + 1)) {  // its input gradient was read now
          in_flight(action.stage + 1, action.microbatch).gradient_handed_over = true;
          forwarded_sets -= release_if_done(action.stage + 1, action.microbatch) ? 1 : 0;
        }
        break;
      }
      case ActionKind::kBackwardWeight:
        compute_start = now();
        model.backward_stage_weight(stage_ctx, f.saved);
        f.weight_done = true;
        break;
      case ActionKind::kSendForward:
        f.sends.push_back(pp_.isend(f.saved.hidden_out(), elements, DType::f32, action.peer,
                                    tag(false, action.stage + 1, action.microbatch)));
        break;
      case ActionKind::kRecvForward:
        if (f.hidden_in.numel() != elements)
          f.hidden_in = Tensor({elements}, DType::f32, ctx.ops.memory(), ctx.tracker,
                               MemoryCategory::activations);
        f.hidden_in_arrival = pp_.irecv(f.hidden_in.f32(), elements, DType::f32, action.peer,
                                        tag(false, action.stage, action.microbatch));
        break;
      case ActionKind::kSendBackward:
        f.sends.push_back(pp_.isend(f.saved.d_hidden_in(), elements, DType::f32, action.peer,
                                    tag(true, action.stage - 1, action.microbatch)));
        f.gradient_handed_over = true;
        break;
      case ActionKind::kRecvBackward:
        if (f.d_hidden_out.numel() != elements)
          f.d_hidden_out = Tensor({elements}, DType::f32, ctx.ops.memory(), ctx.tracker,
                                  MemoryCategory::activations);
        f.gradient_arrival = pp_.irecv(f.d_hidden_out.f32(), elements, DType::f32, action.peer,
                                       tag(true, action.stage, action.microbatch));
        break;
    }
    if (is_compute(action.kind)) {
      const double end = now();
      timeline_.actions.push_back({action, compute_start, end});
      timeline_.compute_seconds += end - compute_start;
    } else if (action.kind == ActionKind::kSendForward ||
               action.kind == ActionKind::kSendBackward) {
      timeline_.actions.push_back({action, compute_start, now()});
    }
    forwarded_sets -= release_if_done(action.stage, action.microbatch) ? 1 : 0;
    if (!draining_.empty()) free_drained_sets(false);
  }
  free_drained_sets(true);
  // A complete schedule (the checker's) leaves nothing in flight.
  check(in_flight_.empty(), "pipeline rank " + std::to_string(rank_) + " ended its step with " +
                                std::to_string(in_flight_.size()) +
                                " activation sets in flight (internal error)");
  timeline_.seconds = now();
  return loss;
}

double PipelineExecutor::evaluate(const model::LayerContext& ctx, const int32_t* tokens,
                                  const int32_t* targets, int64_t B, int64_t T) {
  const int last = schedule_.num_stages() - 1;
  Tensor hidden;  // the previous stage's output, on this rank
  double loss = 0;
  constexpr int kEvaluateTag = 1 << 30;  // apart from run_step's tags
  for (int s = 0; s <= last; ++s) {
    const int owner = schedule_.stage_owner[static_cast<size_t>(s)];
    if (owner != rank_) continue;
    model::Transformer& model = stage(s);
    model::LayerContext stage_ctx = ctx;
    stage_ctx.hooks = stage_entry(s).hooks;
    const int64_t elements = model.tensor_parallel().local_rows(B * T) * model.config().d_model;
    if (s > 0) {
      const int from = schedule_.stage_owner[static_cast<size_t>(s - 1)];
      if (from != rank_) {
        hidden = Tensor({elements}, DType::f32, ctx.ops.memory(), ctx.tracker,
                        MemoryCategory::activations);
        pp_.recv(hidden.f32(), elements, DType::f32, from, kEvaluateTag + s);
      }
    }
    model::StageActivations saved = model.make_activations();
    const float mean = model.forward_stage(stage_ctx, saved, s == 0 ? tokens : nullptr,
                                           s == 0 ? nullptr : hidden.f32(),
                                           s == last ? targets : nullptr, B, T, 1.0f);
    if (s == last) {
      loss = mean;
      break;
    }
    const int to = schedule_.stage_owner[static_cast<size_t>(s + 1)];
    if (to != rank_) {
      pp_.send(saved.hidden_out(), elements, DType::f32, to, kEvaluateTag + s + 1);
    } else {
      Tensor next({elements}, DType::f32, ctx.ops.memory(), ctx.tracker,
                  MemoryCategory::activations);
      ctx.ops.copy(next.f32(), saved.hidden_out(), elements);
      hidden = std::move(next);
    }
  }
  // Every pipeline rank gets the last stage's loss.
  pp_.broadcast(&loss, 1, DType::i64, last_stage_rank());  // a double as 64 bits
  return loss;
}

}  // namespace lattice::pipeline
