// Tests of DiLoCo between replica groups (train/diloco_sync.hpp) on the tiny data-parallel model:
// one group with lr 1 and no momentum trains bit for bit as without DiLoCo (plain DP and ZeRO-1/3
// inside the group); two groups, each a separate Trainer meeting at a real etcd over Gloo, read
// disjoint blocks of one stream and end every outer step on the same parameters bit for bit; a
// group killed with -9 mid-run (threads, and under mpirun) is left out while the other trains on,
// and its restart joins and takes the job's state, with every data block trained exactly once;
// and the one-line refusals (a group that runs another config, too few groups, impossible keys).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../replica/etcd_process.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint_reader.hpp"
#include "mpi_runner.hpp"

using namespace lattice;
using lattice::testing::CorpusDirectoryTest;
using lattice::testing::DpOutcome;
using lattice::testing::run_dp;
using lattice::testing::tiny_dp_config;
using EtcdProcess = lattice::replica::test_support::EtcdProcess;
namespace fs = std::filesystem;

namespace {

// Runs groups.size() replica groups at once, group g with config groups[g], each in a thread of
// its own; each group's outcome, or its error's message.
struct GroupRun {
  DpOutcome outcome;
  std::string error;
};
std::vector<GroupRun> run_groups(const std::vector<train::TrainConfig>& groups) {
  std::vector<GroupRun> runs(groups.size());
  std::vector<std::thread> threads;
  for (size_t g = 0; g < groups.size(); ++g)
    threads.emplace_back([&, g] {
      try {
        runs[g].outcome = run_dp(groups[g]);
      } catch (const std::exception& e) {
        runs[g].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return runs;
}

// Two replica groups of the tiny dp-1 model (batch 4) meeting at `store` as job `job`: group g runs
// in run directory <dir>/<job>-g with the `extra` keys and, when given, `own(g)`.
std::vector<train::TrainConfig> two_groups(const fs::path& dir, const std::string& store,
                                           const std::string& job, std::vector<std::string> extra,
                                           const std::function<std::string(int)>& own = {}) {
  std::vector<train::TrainConfig> groups;
  for (int g = 0; g < 2; ++g) {
    std::vector<std::string> keys = extra;
    keys.insert(keys.end(), {"job.run_dir=" + (dir / (job + "-" + std::to_string(g))).string(),
                             "replica.groups=2", "replica.group=" + std::to_string(g),
                             "replica.store=" + store, "replica.job=" + job});
    if (own) keys.push_back(own(g));
    groups.push_back(tiny_dp_config(dir, 1, 0, 4, 1, keys));
  }
  return groups;
}

}  // namespace

class DilocoTest : public CorpusDirectoryTest {};

TEST_F(DilocoTest, OneGroupWithPlainAveragingTrainsBitForBitAsWithout) {
  for (auto [dp, zero] : {std::pair{1, 0}, {2, 1}, {2, 3}}) {
    SCOPED_TRACE("dp " + std::to_string(dp) + " zero " + std::to_string(zero));
    const DpOutcome plain = run_dp(tiny_dp_config(dir_, dp, zero, 8, 1, {"training.steps=6"}));
    const DpOutcome averaged =
        run_dp(tiny_dp_config(dir_, dp, zero, 8, 1,
                              {"training.steps=6", "diloco.inner_steps=2", "diloco.outer_lr=1",
                               "diloco.outer_momentum=0"}));
    lattice::testing::expect_bit_identical(averaged, plain, "DiLoCo M = 1, lr 1, momentum 0");
    // The paper's outer step (lr 0.7, Nesterov 0.9) does act: from step 3 on the losses differ.
    const DpOutcome outer =
        run_dp(tiny_dp_config(dir_, dp, zero, 8, 1, {"training.steps=6", "diloco.inner_steps=2"}));
    EXPECT_EQ(outer.losses[1], plain.losses[1]);
    EXPECT_NE(outer.losses[2], plain.losses[2]);
  }
}

TEST_F(DilocoTest, TwoGroupsReadDisjointBlocksOfOneStreamAndShareEveryOuterStep) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  const std::vector<GroupRun> runs =
      run_groups(two_groups(dir_, etcd.endpoint(), "two-groups",
                            {"training.steps=6", "diloco.inner_steps=3",
                             "replica.timeout_seconds=30", "metrics.jsonl=true"}));
  ASSERT_EQ(runs[0].error, "");
  ASSERT_EQ(runs[1].error, "");
  // Step 6 ended with an outer step: both groups hold the same parameters, bit for bit.
  const DpOutcome &a = runs[0].outcome, &b = runs[1].outcome;
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.parameters.size(); ++i) differing += a.parameters[i] != b.parameters[i];
  EXPECT_EQ(differing, 0u);
  // Group 0 trains block 0 first: steps 1-3 of the stream one group reads, from the same start,
  // so its first three steps are those of a plain run bit for bit; group 1's block 1 is other data.
  const DpOutcome plain = run_dp(tiny_dp_config(dir_, 1, 0, 4, 1, {"training.steps=6"}));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a.losses[i], plain.losses[i]) << i;
  EXPECT_NE(b.losses[0], a.losses[0]);
  // The quorum's bookkeeping in metrics.jsonl: at step 3 each group brings back its block (0, 1)
  // and takes the next (2, 3); at step 6 brings those back; the weights hash is the same.
  std::vector<std::vector<nlohmann::json>> lines;
  for (int g = 0; g < 2; ++g)
    lines.push_back(
        lattice::testing::read_jsonl(dir_ / ("two-groups-" + std::to_string(g)) / "metrics.jsonl"));
  for (int g = 0; g < 2; ++g) {
    ASSERT_EQ(lines[g].size(), 6u);
    const nlohmann::json& third = lines[g][2].at("diloco");
    EXPECT_EQ(third.at("members"), nlohmann::json::array({0, 1}));
    EXPECT_EQ(third.at("completed_block").get<int64_t>(), g);
    EXPECT_EQ(third.at("next_block").get<int64_t>(), 2 + g);
    EXPECT_EQ(lines[g][5].at("diloco").at("completed_block").get<int64_t>(), 2 + g);
    EXPECT_FALSE(lines[g][1].at("diloco").contains("members"));  // an inner step
  }
  for (int step : {2, 5})
    EXPECT_EQ(lines[0][step].at("diloco").at("weights_hash"),
              lines[1][step].at("diloco").at("weights_hash"));
  // Between outer steps the groups drift apart; after them they train from the same point.
  EXPECT_NE(a.losses[3], b.losses[3]);
}

// Synchronous replica groups (diloco.inner_steps = 0): the groups' gradients are averaged every
// step before the norm and the update, so two groups of one rank train as one dp-2 run — the same
// data (blocks of one step: group g reads what dp rank g reads) and the same mean gradient, up to
// the order of one addition — and end every step on the same weights bit for bit.
TEST_F(DilocoTest, SynchronousGroupsTrainAsOneDataParallelRun) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  const std::vector<GroupRun> runs = run_groups(two_groups(
      dir_, etcd.endpoint(), "sync", {"training.steps=4", "replica.timeout_seconds=30"}));
  ASSERT_EQ(runs[0].error, "");
  ASSERT_EQ(runs[1].error, "");
  const DpOutcome &a = runs[0].outcome, &b = runs[1].outcome;
  EXPECT_EQ(a.parameters, b.parameters);
  // One rank per group: each group's gradient is its rank's, and the mean over the two groups,
  // (g0 + g1) / 2, is the sum-then-scale of a dp-2 allreduce: the same arithmetic, bit for bit.
  // (With dp > 1 inside the groups the order of the additions differs: fp32 rounding.)
  const DpOutcome dp2 = run_dp(tiny_dp_config(dir_, 2, 0, 8, 1, {"training.steps=4"}));
  EXPECT_EQ(a.parameters, dp2.parameters);
  ASSERT_EQ(a.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)  // each group's loss is half the batch's: their mean, in double
    EXPECT_NEAR((a.losses[i] + b.losses[i]) / 2, dp2.losses[i], 1e-6 * dp2.losses[i]) << i;
  EXPECT_NE(a.losses[0], b.losses[0]);  // disjoint data
}

// Streaming DiLoCo on one group: the fragments (P = 2 and 4: the layers dealt round-robin), each
// stepped on its own round, with lr 1 and no momentum leave every parameter as trained, bit for
// bit, with and without ZeRO-3 inside the group; so does an overlapped exchange (τ = 1) whose
// result is mixed in with weight 0 (mixing 1: the parameters trained meanwhile are kept). The
// outer step with the paper's settings acts fragment by fragment (other losses than P = 1's), and
// an outer gradient sent in bf16 or fp4 acts like fp32's within the codecs' rounding.
TEST_F(DilocoTest, StreamingFragmentsOnOneGroupTrainBitForBitAsWithout) {
  for (auto [dp, zero] : {std::pair{1, 0}, {2, 3}}) {
    SCOPED_TRACE("dp " + std::to_string(dp) + " zero " + std::to_string(zero));
    const DpOutcome plain = run_dp(tiny_dp_config(dir_, dp, zero, 8, 1, {"training.steps=8"}));
    for (const char* streaming : {"diloco.fragments=2", "diloco.fragments=4"}) {
      const DpOutcome averaged =
          run_dp(tiny_dp_config(dir_, dp, zero, 8, 1,
                                {"training.steps=8", "diloco.inner_steps=4", streaming,
                                 "diloco.outer_lr=1", "diloco.outer_momentum=0"}));
      lattice::testing::expect_bit_identical(averaged, plain, streaming);
    }
    const DpOutcome overlapped = run_dp(tiny_dp_config(
        dir_, dp, zero, 8, 1,
        {"training.steps=8", "diloco.inner_steps=4", "diloco.fragments=2", "diloco.overlap_steps=1",
         "diloco.mixing=1", "diloco.outer_lr=1", "diloco.outer_momentum=0"}));
    lattice::testing::expect_bit_identical(overlapped, plain, "overlap 1, mixing 1");
  }
  const DpOutcome whole =
      run_dp(tiny_dp_config(dir_, 1, 0, 8, 1, {"training.steps=8", "diloco.inner_steps=4"}));
  const DpOutcome fragmented = run_dp(tiny_dp_config(
      dir_, 1, 0, 8, 1, {"training.steps=8", "diloco.inner_steps=4", "diloco.fragments=2"}));
  EXPECT_EQ(fragmented.losses[1], whole.losses[1]);  // before the first round (step 2)
  EXPECT_NE(fragmented.losses[2], whole.losses[2]);
  for (const char* exchange : {"diloco.exchange=bf16", "diloco.exchange=fp4"}) {
    const DpOutcome encoded = run_dp(tiny_dp_config(
        dir_, 1, 0, 8, 1,
        {"training.steps=8", "diloco.inner_steps=4", "diloco.fragments=2", exchange}));
    EXPECT_NE(encoded.parameters, fragmented.parameters) << exchange;  // the rounding acts
    // The outer gradients (a few steps' drift, ~1e-3) rounded to 8 or 2 significant bits move
    // the loss by far less than training does: within 1% of fp32's after 8 steps.
    EXPECT_NEAR(encoded.losses.back(), fragmented.losses.back(), 1e-2 * fragmented.losses.back())
        << exchange;
  }
}

// Streaming DiLoCo between two groups (P = 3 fragments of H = 6: a round every 2 steps, each
// exchange overlapped with one inner step, the outer gradients in fp4): the data blocks are those
// of the rounds (2 steps), every round ends with the same global fragment on both groups (its
// hash), and the largest exchange is more than 10x smaller than DiLoCo's whole-model fp32 one at
// the same H.
TEST_F(DilocoTest, StreamingGroupsShareEachFragmentAndSendATenthOfDilocosPeak) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  const auto lines_of = [&](const std::string& job, std::vector<std::string> keys) {
    keys.insert(keys.end(), {"training.steps=6", "diloco.inner_steps=6",
                             "replica.timeout_seconds=30", "metrics.jsonl=true"});
    const std::vector<GroupRun> runs = run_groups(two_groups(dir_, etcd.endpoint(), job, keys));
    EXPECT_EQ(runs[0].error, "");
    EXPECT_EQ(runs[1].error, "");
    std::vector<std::vector<nlohmann::json>> lines;
    for (int g = 0; g < 2; ++g)
      lines.push_back(
          lattice::testing::read_jsonl(dir_ / (job + "-" + std::to_string(g)) / "metrics.jsonl"));
    return lines;
  };
  const auto streaming = lines_of(
      "streaming", {"diloco.fragments=3", "diloco.overlap_steps=1", "diloco.exchange=fp4"});
  const auto diloco = lines_of("whole", {});
  ASSERT_EQ(streaming[0].size(), 6u);
  ASSERT_EQ(streaming[1].size(), 6u);
  int64_t streaming_peak = 0;
  for (int g = 0; g < 2; ++g)
    for (int step = 1; step <= 6; ++step) {
      const nlohmann::json& d = streaming[g][step - 1].at("diloco");
      if (step % 2 == 1) {  // an inner step (step 1, 3, 5 start the next round's exchange)
        EXPECT_FALSE(d.contains("members")) << step;
        continue;
      }
      EXPECT_EQ(d.at("completed_block").get<int64_t>(), 2 * (step / 2 - 1) + g) << step;
      EXPECT_EQ(d.at("next_block").get<int64_t>(), 2 * (step / 2) + g) << step;
      EXPECT_EQ(d.at("outer_steps").get<int64_t>(), step / 2) << step;
      EXPECT_EQ(d.at("weights_hash"), streaming[1 - g][step - 1].at("diloco").at("weights_hash"))
          << step;
      EXPECT_GT(d.at("round_bytes").get<int64_t>(), 0) << step;
      EXPECT_GT(d.at("peak_gbps").get<double>(), 0) << step;
      streaming_peak = std::max(streaming_peak, d.at("round_bytes").get<int64_t>());
    }
  EXPECT_EQ(streaming[0][5].at("diloco").at("peak_round_bytes").get<int64_t>(), streaming_peak);
  const int64_t diloco_peak = diloco[0][5].at("diloco").at("peak_round_bytes").get<int64_t>();
  EXPECT_GT(diloco_peak, 10 * streaming_peak) << diloco_peak << " vs " << streaming_peak;
}

TEST_F(DilocoTest, GroupsThatDisagreeOrNeverComeAreOneErrorLine) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  // The group that comes second with another config is refused; the first goes on alone once
  // the other has not come within the timeout.
  const std::vector<train::TrainConfig> groups = two_groups(
      dir_, etcd.endpoint(), "disagree", {"diloco.inner_steps=2", "replica.timeout_seconds=2"},
      [](int g) { return g == 0 ? "optimizer.lr=3e-3" : "optimizer.lr=1e-3"; });
  const std::vector<GroupRun> runs = run_groups(groups);
  ASSERT_NE(runs[0].error.empty(), runs[1].error.empty()) << runs[0].error << runs[1].error;
  const std::string& refused = runs[0].error.empty() ? runs[1].error : runs[0].error;
  EXPECT_NE(refused.find("runs another model, layout, batch or optimizer than group"),
            std::string::npos)
      << refused;
  EXPECT_EQ(refused.find('\n'), std::string::npos);

  // Alone under replica.min_groups = 2: refused after the timeout, naming the key.
  train::TrainConfig alone = groups[0];
  alone.replica.job = "alone";
  alone.replica.timeout_seconds = 1;
  alone.replica.min_groups = 2;
  const std::vector<GroupRun> lonely = run_groups({alone});
  EXPECT_NE(lonely[0].error.find("only 1 of the 2 replica groups came within 1000 ms"),
            std::string::npos)
      << lonely[0].error;
  EXPECT_NE(lonely[0].error.find("replica.min_groups = 2"), std::string::npos) << lonely[0].error;
}

TEST_F(DilocoTest, RefusesImpossibleReplicaKeysInOneLine) {
  const auto refusal = [&](std::vector<std::string> keys) {
    try {
      tiny_dp_config(dir_, 1, 0, 4, 1, std::move(keys));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal({"replica.groups=2", "replica.store=127.0.0.1:2379", "parallelism.pp=2"})
                .find("synchronous replica groups (replica.groups > 1, diloco.inner_steps = 0) "
                      "with a pipeline are not built yet"),
            std::string::npos);
  EXPECT_NE(refusal({"replica.groups=2", "replica.store=127.0.0.1:2379", "replica.min_groups=3"})
                .find("replica.min_groups = 3 must be in 1 .. replica.groups = 2"),
            std::string::npos);
  EXPECT_NE(refusal({"replica.groups=2"}).find("needs replica.store"), std::string::npos);
  EXPECT_NE(refusal({"replica.groups=2", "replica.group=2"}).find("is not a group"),
            std::string::npos);
  EXPECT_NE(refusal({"diloco.inner_steps=-1"}).find("diloco.inner_steps"), std::string::npos);
  EXPECT_NE(
      refusal({"diloco.inner_steps=5", "diloco.outer_momentum=1"}).find("diloco.outer_momentum"),
      std::string::npos);
  EXPECT_NE(refusal({"replica.job=a/b"}).find("replica.job"), std::string::npos);
  // Streaming DiLoCo's keys.
  EXPECT_NE(refusal({"diloco.fragments=2"}).find("need diloco.inner_steps > 0"), std::string::npos);
  EXPECT_NE(refusal({"diloco.inner_steps=6", "diloco.fragments=4"})
                .find("must be a multiple of diloco.fragments = 4"),
            std::string::npos);
  EXPECT_NE(refusal({"diloco.inner_steps=10", "diloco.fragments=5"}).find("must be in 1 .. 4"),
            std::string::npos);  // gpt2-tiny: the embedding, 2 blocks, the head
  EXPECT_NE(refusal({"diloco.inner_steps=4", "diloco.fragments=2", "diloco.overlap_steps=2"})
                .find("diloco.overlap_steps = 2 must be in 0 .. 1"),
            std::string::npos);
  EXPECT_NE(refusal({"diloco.inner_steps=4", "diloco.mixing=1.5"}).find("diloco.mixing"),
            std::string::npos);
  EXPECT_NE(refusal({"diloco.inner_steps=4", "diloco.exchange=int8"})
                .find("diloco.exchange must be fp32, bf16 or fp4"),
            std::string::npos);
}

// The outer state (anchor, momentum) is in the checkpoints: resumed from its checkpoint of step 4
// (between the outer steps of H = 3), a run goes on bit for bit as the run that never stopped;
// resumed in another layout (dp 2 ZeRO-1 to dp 1) it reshards, equal within fp32 rounding of
// another reduction order.
TEST_F(DilocoTest, ResumesBitForBitAndReshardsTheOuterState) {
  const auto config = [&](const std::string& run, int dp, int zero,
                          std::vector<std::string> more = {}) {
    more.insert(more.end(),
                {"job.run_dir=" + (dir_ / run).string(), "training.steps=6", "diloco.inner_steps=3",
                 "checkpoint.enable=true", "checkpoint.interval=4"});
    return tiny_dp_config(dir_, dp, zero, 8, 1, more);
  };
  const DpOutcome whole = run_dp(config("whole", 2, 1));
  const std::string step4 = (dir_ / "whole" / "checkpoints" / "step_00000004").string();
  const DpOutcome resumed = run_dp(config("resumed", 2, 1, {"checkpoint.resume_from=" + step4}));
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], whole.losses[4]);
  EXPECT_EQ(resumed.losses[1], whole.losses[5]);
  EXPECT_EQ(resumed.parameters, whole.parameters);

  const DpOutcome resharded =
      run_dp(config("resharded", 1, 0, {"checkpoint.resume_from=" + step4}));
  ASSERT_EQ(resharded.losses.size(), 2u);
  // Another reduction order over a few AdamW steps: the data-parallel tests' bounds.
  EXPECT_NEAR(resharded.losses[1], whole.losses[5], 1e-5 * whole.losses[5]);
  float scale = 0, worst = 0;
  for (size_t i = 0; i < whole.parameters.size(); ++i) {
    scale = std::max(scale, std::abs(whole.parameters[i]));
    worst = std::max(worst, std::abs(whole.parameters[i] - resharded.parameters[i]));
  }
  EXPECT_LE(worst, 1e-4f * scale);
}

#ifdef LATTICE_MPIEXEC
// The groups as they run at two sites: group 0 one `mpirun -np 2` (mpi backend), group 1 two
// threads of one `lattice train` (local backend), meeting at etcd. After the last outer step both
// checkpoints hold the same weights, bit for bit.
TEST_F(DilocoTest, AGroupUnderMpirunAndAGroupOnThreadsShareTheOuterSteps) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  const auto flags = [&](int group) {
    const fs::path run = dir_ / ("site" + std::to_string(group));
    return " --model.preset=gpt2-tiny --model.vocab_size=256 --model.max_seq_len=32"
           " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
           " --training.precision=fp32 --training.steps=4 --optimizer.lr=3e-3"
           " --lr_scheduler.warmup_steps=1 --data.train_files=" +
           (dir_ / "corpus.txt").string() +
           " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1 --dp 2"
           " --diloco.inner_steps=2 --replica.groups=2 --replica.store=" +
           etcd.endpoint() + " --replica.job=sites --replica.timeout_seconds=60 --replica-group " +
           std::to_string(group) + " --job.run_dir=" + run.string();
  };
  for (int g = 0; g < 2; ++g) fs::create_directories(dir_ / ("work" + std::to_string(g)));
  lattice::testing::CliResult mpi, threads;
  std::thread site0(
      [&] { mpi = lattice::testing::run_mpi(2, "train" + flags(0), dir_ / "work0"); });
  threads = lattice::testing::run_lattice("train" + flags(1), dir_ / "work1");
  site0.join();
  ASSERT_EQ(mpi.status, 0) << mpi.out << mpi.err;
  ASSERT_EQ(threads.status, 0) << threads.out << threads.err;
  EXPECT_NE(mpi.out.find("(mpi backend)"), std::string::npos) << mpi.out;
  EXPECT_NE(threads.out.find("diloco: 2 outer steps"), std::string::npos) << threads.out;
  train::CheckpointReader a((dir_ / "site0" / "checkpoints" / "step_00000004").string());
  train::CheckpointReader b((dir_ / "site1" / "checkpoints" / "step_00000004").string());
  size_t compared = 0;
  for (const std::string& name : a.names()) {
    if (name.find('/') != std::string::npos) continue;  // the weights, not the optimizer states
    const Shape& shape = a.global_shape(name);
    std::vector<float> x(static_cast<size_t>(shape_numel(shape))), y(x.size());
    a.read(name, shape, x.data());
    b.read(name, shape, y.data());
    EXPECT_EQ(x, y) << name;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
  // The exchanges in metrics.jsonl: none on inner steps; at each outer step (2, 4) a ring over two
  // members sends 2·(2-1)/2 of the rank's 4-byte parameters (its whole store: 4 bytes a parameter,
  // and the alignment gaps between them).
  const std::vector<nlohmann::json> lines =
      lattice::testing::read_jsonl(dir_ / "site1" / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  // Before the first step only the store is spoken to (the groups' fingerprints are there).
  int64_t total = 0;
  const int64_t params =
      train::load_train_config("", {"model.preset=gpt2-tiny", "model.vocab_size=256",
                                    "model.max_seq_len=32", "training.seq_len=32"})
          .model.parameter_count();
  for (const nlohmann::json& line : lines) {
    const nlohmann::json& d = line.at("diloco");
    const int64_t step = line.at("step").get<int64_t>(), bytes = d.at("step_bytes").get<int64_t>();
    total += bytes;
    EXPECT_EQ(d.at("bytes_sent").get<int64_t>(), total) << step;
    EXPECT_EQ(d.at("outer_steps").get<int64_t>(), step / 2) << step;
    if (step % 2 == 1) {
      EXPECT_EQ(bytes, 0) << step;
    } else {
      EXPECT_GE(bytes, 4 * params) << step;
      EXPECT_LT(bytes, 4 * params + 64 * 64) << step;  // at most 64 bytes of gap per tensor
      EXPECT_GT(d.at("outer_seconds").get<double>(), 0) << step;
    }
  }
}
#endif
