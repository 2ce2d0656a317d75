// PipelineExecutor: see executor.hpp.
#include "lattice/parallel/pipeline/executor.hpp"

#include <algorithm>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"

namespace lattice::pipeline {

PipelineExecutor::PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                                   std::vector<model::Transformer*> stages)
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
  for (const auto& [s, model] : stages_) {
    check(model->has_embedding() == (s == 0) && model->has_head() == (s == last),
          "virtual stage " + std::to_string(s) + " of " + std::to_string(last + 1) +
              ": the embedding belongs on the first stage and the head on the last");
  }
}

bool PipelineExecutor::owns(int virtual_stage) const {
  return stages_.count(virtual_stage) != 0;
}

model::Transformer& PipelineExecutor::stage(int virtual_stage) {
  const auto it = stages_.find(virtual_stage);
  check(it != stages_.end(), "pipeline rank " + std::to_string(rank_) + " does not own stage " +
                                 std::to_string(virtual_stage) + " (internal error)");
  return *it->second;
}

PipelineExecutor::InFlight& PipelineExecutor::in_flight(int virtual_stage, int microbatch) {
  auto [it, fresh] = in_flight_.try_emplace({virtual_stage, microbatch});
  if (fresh) {
    it->second.saved = stage(virtual_stage).make_activations();
    it->second.gradient_handed_over = virtual_stage == 0;  // the first stage's goes nowhere
  }
  return it->second;
}

bool PipelineExecutor::release_if_done(int virtual_stage, int microbatch) {
  const auto it = in_flight_.find({virtual_stage, microbatch});
  if (it == in_flight_.end()) return false;
  InFlight& f = it->second;
  if (!(f.backward_done && f.weight_done && f.gradient_handed_over)) return false;
  for (comm::CommHandle& send : f.sends) send.wait();  // they read its tensors
  in_flight_.erase(it);
  return true;
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
  int forwarded_sets = 0;  // forwarded and not yet freed (every freed set was forwarded)
  for (const Action& action : schedule_.actions[static_cast<size_t>(rank_)]) {
    model::Transformer& model = stage(action.stage);
    const int64_t elements = model.tensor_parallel().local_rows(B * T) * model.config().d_model;
    InFlight& f = in_flight(action.stage, action.microbatch);
    const auto mb = static_cast<size_t>(action.microbatch);
    switch (action.kind) {
      case ActionKind::kForward: {
        // The input: received from the previous stage's rank, or that stage's output when this
        // rank holds it too (interleaved and V schedules).
        const float* hidden_in = nullptr;
        if (action.stage > 0) {
          f.hidden_in_arrival.wait();
          hidden_in = owns(action.stage - 1)
                          ? in_flight(action.stage - 1, action.microbatch).saved.hidden_out()
                          : f.hidden_in.f32();
          check(hidden_in != nullptr, describe(action) + " on pipeline rank " +
                                          std::to_string(rank_) +
                                          " before its input arrived (schedule error)");
        }
        const float mean = model.forward_stage(
            ctx, f.saved, action.stage == 0 ? batches.tokens[mb] : nullptr, hidden_in,
            action.stage == last ? batches.targets[mb] : nullptr, B, T, loss_scale);
        if (action.stage == last) loss += mean;
        peak_in_flight_ = std::max(peak_in_flight_, ++forwarded_sets);
        break;
      }
      case ActionKind::kBackward: {
        // The output gradient: received from the next stage's rank, or that stage's input
        // gradient when this rank holds it too.
        const float* d_hidden_out = nullptr;
        if (action.stage < last) {
          f.gradient_arrival.wait();
          d_hidden_out = owns(action.stage + 1)
                             ? in_flight(action.stage + 1, action.microbatch).saved.d_hidden_in()
                             : f.d_hidden_out.f32();
          check(d_hidden_out != nullptr,
                describe(action) + " on pipeline rank " + std::to_string(rank_) +
                    " before its output gradient arrived (schedule error)");
        }
        if (schedule_.splits_weight_gradient)
          model.backward_stage_input(ctx, f.saved, d_hidden_out);
        else
          model.backward_stage(ctx, f.saved, d_hidden_out);
        f.backward_done = true;
        f.weight_done = !schedule_.splits_weight_gradient;
        if (action.stage < last && owns(action.stage + 1)) {  // its input gradient was read now
          in_flight(action.stage + 1, action.microbatch).gradient_handed_over = true;
          forwarded_sets -= release_if_done(action.stage + 1, action.microbatch) ? 1 : 0;
        }
        break;
      }
      case ActionKind::kBackwardWeight:
        model.backward_stage_weight(ctx, f.saved);
        f.weight_done = true;
        break;
      case ActionKind::kSendForward:
        f.sends.push_back(pp_.isend(f.saved.hidden_out(), elements, DType::f32, action.peer,
                                    tag(false, action.stage + 1, action.microbatch)));
        break;
      case ActionKind::kRecvForward:
        if (f.hidden_in.numel() != elements)
          f.hidden_in = Tensor({elements}, DType::f32, ctx.tracker, MemoryCategory::activations);
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
          f.d_hidden_out = Tensor({elements}, DType::f32, ctx.tracker, MemoryCategory::activations);
        f.gradient_arrival = pp_.irecv(f.d_hidden_out.f32(), elements, DType::f32, action.peer,
                                       tag(true, action.stage, action.microbatch));
        break;
    }
    forwarded_sets -= release_if_done(action.stage, action.microbatch) ? 1 : 0;
  }
  // A complete schedule (the checker's) leaves nothing in flight.
  check(in_flight_.empty(), "pipeline rank " + std::to_string(rank_) + " ended its step with " +
                                std::to_string(in_flight_.size()) +
                                " activation sets in flight (internal error)");
  return loss;
}

}  // namespace lattice::pipeline
