// Memory as scheduled (issue #22 item 2): a pipeline rank holds the activations of its in-flight
// microbatches only. For every schedule at pp 2 and 4, each rank's measured activation peak (the
// MemoryTracker's, over real training steps) is held to estimate_pipeline_activations — the
// schedule's peak in-flight count on that rank times one set's bytes plus what only the running
// backward holds — within 10%, and it grows with the in-flight count as the schedule says (GPipe
// holds every microbatch, 1F1B at most pp). The estimate is what `lattice estimate memory
// --config` prints per rank (checked in PipelineMemory.EstimateCliPrintsEveryRank).
#include <gtest/gtest.h>
#include <omp.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/parallel/pipeline/pipeline_memory.hpp"
#include "lattice/train/trainer.hpp"

using namespace lattice;
using namespace lattice::testing;

namespace {

struct RankMemory {
  int64_t measured = 0;
  pipeline::PipelineActivationMemory estimate;
};

// Trains `config` on its pp local ranks; each rank's measured peak and estimate.
std::vector<RankMemory> train_and_measure(const train::TrainConfig& config) {
  std::vector<RankMemory> out(static_cast<size_t>(config.parallelism.pp));
  std::mutex lock;
  comm::run_local_ranks_or_inline(
      static_cast<int>(config.parallelism.pp), [&](comm::Communicator* group) {
        omp_set_num_threads(1);
        train::Trainer trainer(config, group);
        trainer.run();
        train::PipelineRank& pipe = *trainer.pipeline();
        std::vector<const model::Transformer*> stages;
        for (int i = 0; i < pipe.stage_count(); ++i) stages.push_back(&pipe.model(i));
        const kernels::CpuOps ops;
        const int rank =
            pipe.executor().schedule().stage_owner[static_cast<size_t>(pipe.virtual_stage(0))];
        RankMemory m;
        m.measured = trainer.memory().peak(MemoryCategory::activations);
        m.estimate = pipeline::estimate_pipeline_activations(
            pipe.schedule(), rank, stages, config.training.precision,
            config.training.micro_batch_size, config.training.seq_len, ops);
        std::lock_guard<std::mutex> guard(lock);
        out[static_cast<size_t>(rank)] = m;
      });
  return out;
}

class PipelineMemory : public CorpusDirectoryTest {};

}  // namespace

TEST_F(PipelineMemory, EachRankHoldsItsInFlightMicrobatchesOnly) {
  struct Case {
    const char* schedule;
    int pp;
    const char* layers = "";  // parallelism.pipeline_layers (empty: even)
  };
  // The interleaved and V ranks with uneven stages hold sets of two sizes.
  for (const Case c : {Case{"gpipe", 2}, Case{"1f1b", 2}, Case{"interleaved", 2}, Case{"zb-h1", 2},
                       Case{"zb-v", 2}, Case{"gpipe", 4}, Case{"1f1b", 4}, Case{"zb-h1", 4},
                       Case{"interleaved", 2, "[1,3,3,1]"}, Case{"zb-v", 2, "[3,1,1,3]"}}) {
    SCOPED_TRACE(std::string(c.schedule) + " pp " + std::to_string(c.pp) + " " + c.layers);
    // 8 blocks of d_model 64 on 8 microbatches of 2 x 32 tokens (GPipe holds all 8).
    const train::TrainConfig config = tiny_dp_config(
        dir_, 1, 0, 16, 8,
        {"parallelism.pp=" + std::to_string(c.pp),
         std::string("parallelism.pipeline_schedule=") + c.schedule, "model.n_layers=8",
         "model.d_model=64", "model.tied_embeddings=false", "training.steps=2",
         *c.layers ? std::string("parallelism.pipeline_layers=") + c.layers
                   : std::string("parallelism.pipeline_partition=even")});
    const std::vector<RankMemory> ranks = train_and_measure(config);
    for (size_t r = 0; r < ranks.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const RankMemory& m = ranks[r];
      ASSERT_GT(m.measured, 0);
      EXPECT_GE(m.estimate.in_flight, 1);
      // Within 10% of the estimate (the stages' own small buffers, e.g. the embedding's, are not
      // modelled).
      EXPECT_NEAR(static_cast<double>(m.measured), static_cast<double>(m.estimate.total()),
                  0.1 * static_cast<double>(m.estimate.total()))
          << "measured " << m.measured << ", estimate " << m.estimate.held_bytes << " in "
          << m.estimate.in_flight << " sets (" << m.estimate.awaiting_weight << " awaiting W) + "
          << m.estimate.running;
      // More sets in flight than one is more memory than one set: the schedule decides it.
      if (m.estimate.in_flight > 1) EXPECT_GT(m.measured, 2 * m.estimate.per_microbatch);
    }
    if (std::string(c.schedule) == "gpipe") EXPECT_EQ(ranks[0].estimate.in_flight, 8);
    if (std::string(c.schedule) == "1f1b") EXPECT_EQ(ranks[0].estimate.in_flight, c.pp);
  }
}

TEST_F(PipelineMemory, EstimateCliPrintsEveryRank) {
  // `lattice estimate memory --config` with a pipeline: one entry per pipeline rank, each the
  // estimate above (1F1B: rank r holds pp - r sets; GPipe: every microbatch on every rank).
  std::ofstream(dir_ / "empty.toml") << "";
  const std::string base = "estimate memory --json --config " + (dir_ / "empty.toml").string() +
                           " --model.preset=gpt2-tiny --model.n_layers=8 --training.seq_len=32 "
                           "--model.max_seq_len=32 --training.global_batch_size=16 "
                           "--training.gradient_accumulation_steps=8 --parallelism.pp=4";
  for (const char* schedule : {"1f1b", "gpipe"}) {
    SCOPED_TRACE(schedule);
    CliResult r =
        run_lattice(base + " --parallelism.pipeline_schedule=" + std::string(schedule), dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const nlohmann::json& ranks = j.at("trainer_pipeline_activations");
    ASSERT_EQ(ranks.size(), 4u) << r.out;
    for (size_t rank = 0; rank < 4; ++rank) {
      const int expected = std::string(schedule) == "gpipe" ? 8 : 4 - static_cast<int>(rank);
      EXPECT_EQ(ranks[rank].at("in_flight").get<int>(), expected) << rank;
      // One stage per rank and no W: every held set is that stage's.
      EXPECT_EQ(ranks[rank].at("held_bytes").get<int64_t>(),
                ranks[rank].at("in_flight").get<int64_t>() *
                    ranks[rank].at("per_microbatch_bytes").get<int64_t>());
      EXPECT_EQ(ranks[rank].at("total_bytes").get<int64_t>(),
                ranks[rank].at("held_bytes").get<int64_t>() +
                    ranks[rank].at("running_bytes").get<int64_t>());
    }
  }
}
