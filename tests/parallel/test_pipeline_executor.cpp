// The pipeline executor (issue #22 item 1): a model split into virtual stages over 2 or 4 local
// pipeline ranks runs one training step of m microbatches under each schedule (GPipe, 1F1B,
// interleaved 1F1B, ZB-H1, ZB-V), and every stage's parameter gradients and the summed loss match
// one rank that accumulates the same microbatches with the same 1/m loss scale. The reference is
// that single-rank run. Each stage runs the same operations on the same values, and every one of
// these schedules runs a stage's backwards (its W halves, when split) in microbatch order, so each
// gradient accumulates the same terms in the same order: bit for bit, and the same loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/parallel/pipeline/executor.hpp"
#include "lattice/parallel/pipeline/replay.hpp"

using namespace lattice;
using namespace lattice::model;
using namespace lattice::pipeline;

namespace {

constexpr int kMicrobatches = 4;
constexpr int64_t kB = 2, kT = 16;

ModelConfig tiny() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_layers = 8;  // pp 4 with 2 chunks per rank: one block per virtual stage
  c.init_std = 0.2f;
  c.vocab_size = 96;
  c.tied_embeddings = false;  // a tied head's copy on the last stage is issue #22 item 4
  return c;
}

struct Batches {
  std::vector<std::vector<int32_t>> tokens, targets;
  Microbatches view() const {
    Microbatches m;
    for (const auto& t : tokens) m.tokens.push_back(t.data());
    for (const auto& t : targets) m.targets.push_back(t.data());
    m.B = kB;
    m.T = kT;
    return m;
  }
};

Batches batches(int64_t vocab) {
  Rng rng(31);
  Batches b;
  for (int i = 0; i < kMicrobatches; ++i) {
    std::vector<int32_t> tokens, targets;
    for (int64_t j = 0; j < kB * kT; ++j) {
      tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
      targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    }
    b.tokens.push_back(tokens);
    b.targets.push_back(targets);
  }
  return b;
}

struct Case {
  ScheduleKind kind;
  int ranks, chunks;
};

std::string name_of(const Case& c) {
  return schedule_kind_name(c.kind) + " pp" + std::to_string(c.ranks) +
         (c.chunks > 1 ? " v" + std::to_string(c.chunks) : "");
}

}  // namespace

TEST(PipelineExecutor, EveryScheduleGivesOneRanksGradients) {
  const ModelConfig config = tiny();
  const Batches b = batches(config.vocab_size);
  kernels::CpuOps reference_ops;
  const LayerContext reference_ctx{reference_ops, kernels::Precision::fp32, nullptr};
  Transformer whole(config, nullptr);
  whole.initialize(7);
  whole.parameters().zero_grads();
  double reference_loss = 0;
  for (int i = 0; i < kMicrobatches; ++i) {
    reference_loss +=
        whole.forward(reference_ctx, b.tokens[static_cast<size_t>(i)].data(),
                      b.targets[static_cast<size_t>(i)].data(), kB, kT, 1.0f / kMicrobatches);
    whole.backward(reference_ctx);
  }
  const ParameterStore& all = whole.parameters();

  for (const Case c :
       {Case{ScheduleKind::kGPipe, 2, 1}, Case{ScheduleKind::kOneFOneB, 2, 1},
        Case{ScheduleKind::kOneFOneB, 4, 1}, Case{ScheduleKind::kInterleaved, 2, 2},
        Case{ScheduleKind::kInterleaved, 4, 2}, Case{ScheduleKind::kZeroBubbleH1, 2, 1},
        Case{ScheduleKind::kZeroBubbleH1, 4, 1}, Case{ScheduleKind::kZeroBubbleV, 2, 2}}) {
    SCOPED_TRACE(name_of(c));
    const Schedule schedule = make_schedule(c.kind, c.ranks, kMicrobatches, c.chunks);
    const int stages = schedule.num_stages();
    const int64_t per_stage = config.n_layers / stages;
    comm::run_local_ranks(c.ranks, [&](comm::Communicator& group) {
      std::vector<std::unique_ptr<Transformer>> models;
      std::vector<Transformer*> mine;
      for (int s = 0; s < stages; ++s) {
        if (schedule.stage_owner[static_cast<size_t>(s)] != group.rank()) continue;
        models.push_back(std::make_unique<Transformer>(
            config, nullptr, StageRange{s * per_stage, (s + 1) * per_stage}));
        models.back()->initialize(7);
        models.back()->parameters().zero_grads();
        mine.push_back(models.back().get());
      }
      PipelineExecutor executor(schedule, group, mine);
      kernels::CpuOps ops;
      const LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
      const double loss = executor.run_step(ctx, b.view());
      // Memory as scheduled: a set lives from its forward to its backward (its W when split), so
      // the most this rank holds is the most forwards its list has ahead of those.
      int ahead = 0, most = 0;
      const ActionKind done =
          schedule.splits_weight_gradient ? ActionKind::kBackwardWeight : ActionKind::kBackward;
      for (const Action& action : schedule.actions[static_cast<size_t>(group.rank())]) {
        if (action.kind == ActionKind::kForward) most = std::max(most, ++ahead);
        if (action.kind == done) --ahead;
      }
      EXPECT_EQ(executor.peak_in_flight(), most) << "rank " << group.rank();
      // Without W the count is the replay's (the simulator's view of the same list).
      if (!schedule.splits_weight_gradient)
        EXPECT_EQ(
            executor.peak_in_flight(),
            replay(schedule, uniform_costs(1, 2)).peak_in_flight[static_cast<size_t>(group.rank())])
            << "rank " << group.rank();
      const bool holds_last = schedule.stage_owner.back() == group.rank();
      if (holds_last)
        EXPECT_EQ(loss, reference_loss);
      else
        EXPECT_EQ(loss, 0.0);
      for (const auto& model : models) {
        const ParameterStore& p = model->parameters();
        for (const ParameterInfo& info : p.parameters()) {
          const ParameterInfo& w = all.info(all.index_of(info.name));
          ASSERT_EQ(info.numel, w.numel) << info.name;
          int64_t differing = 0;
          for (int64_t i = 0; i < info.numel; ++i)
            differing += all.grads()[w.offset + i] != p.grads()[info.offset + i];
          EXPECT_EQ(differing, 0) << info.name;
        }
      }
    });
  }
}

TEST(PipelineExecutor, RefusesModelsThatDoNotMatchTheSchedule) {
  const ModelConfig config = tiny();
  const Schedule schedule = make_schedule(ScheduleKind::kOneFOneB, 2, kMicrobatches);
  comm::run_local_ranks(2, [&](comm::Communicator& group) {
    // Each rank given the whole model: the embedding and head on a middle position.
    Transformer whole(config, nullptr);
    try {
      PipelineExecutor executor(schedule, group, {&whole});
      ADD_FAILURE() << "a whole model was accepted as one stage of two";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the embedding belongs on the first stage"),
                std::string::npos)
          << e.what();
    }
  });
}
