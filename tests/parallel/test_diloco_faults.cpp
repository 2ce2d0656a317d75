// The replica groups' fault tolerance end to end, as a user runs it: two groups, each its own
// process (`lattice train`, or one `mpirun`), meet at a real etcd. Group 1 is killed with -9
// after step 3 (its rank dies mid-block: the fault runner raises SIGKILL); group 0 notices within
// the timeout, leaves it out and trains on without a lost step; group 1 is started again from
// nothing, joins a later outer step and takes the job's state from group 0 — parameters, AdamW
// moments and the outer state, checked by a hash both sides print — and from then on both end
// every outer step on the same weights. Across the three processes every data block is brought
// back exactly once: no sample skipped, none trained twice (the quorum records in metrics.jsonl).
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../replica/etcd_process.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "mpi_runner.hpp"

using namespace lattice;
using lattice::testing::CliResult;
using lattice::testing::CorpusDirectoryTest;
using EtcdProcess = lattice::replica::test_support::EtcdProcess;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 14;

// The outer step and state hash of a "handed ... / took the job's state" line in `out`.
std::map<std::string, std::string> hand_overs(const std::string& out, const std::string& verb) {
  std::map<std::string, std::string> found;  // outer step -> hash
  const std::regex line(verb + R"(.* at (?:outer )?step (\d+).*\(state fnv (\d+)\))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it)
    found[(*it)[1]] = (*it)[2];
  return found;
}

class DilocoFaultTest : public CorpusDirectoryTest {
 protected:
  // `lattice train`'s flags for group `group` of the two, in run directory `run`.
  std::string flags(int group, const std::string& run, int dp) const {
    // inner_ steps between exchanges: 2 (DiLoCo) or 0 (synchronous: every step, blocks of one).
    return " --model.preset=gpt2-tiny --model.vocab_size=256 --model.max_seq_len=32"
           " --training.seq_len=32 --training.global_batch_size=" +
           std::to_string(4 * dp) +
           " --training.threads=1 --training.precision=fp32 --training.steps=" +
           std::to_string(kSteps) +
           " --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1 --data.train_files=" +
           (dir_ / "corpus.txt").string() +
           " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1 --dp " +
           std::to_string(dp) + " --diloco.inner_steps=" + std::to_string(inner_) +
           " --replica.groups=2 --replica.store=" + etcd_.endpoint() +
           " --replica.job=faults --replica.timeout_seconds=30 --replica.lease_seconds=2"
           " --replica.group=" +
           std::to_string(group) + " --job.run_dir=" + (dir_ / run).string() + extra_;
  }

  fs::path work(const std::string& name) const {
    fs::create_directories(dir_ / name);
    return dir_ / name;
  }

  // Group 0 on threads, stalled 6 s before step 9 (less than the 30 s timeout: a live group is
  // waited for) so that the restarted group 1 finds it still running; group 1 (on threads, or under
  // `mpirun -np dp` when `mpi`) killed after step 3, then started again from nothing. Checks
  // everything the file's comment names.
  // `extra`: more flags for both groups; `every`: the steps between exchanges (0: H, or 1).
  void run_and_check(bool mpi, int dp, int inner, const std::string& extra = "", int every = 0) {
    inner_ = inner;
    extra_ = extra;
    if (every == 0) every = std::max(1, inner);
    const std::string runner = LATTICE_FAULT_RUNNER;
    CliResult survivor, killed, again;
    std::thread group0([&] {
      survivor = lattice::testing::run_program(
          runner,
          "--stall-rank=0 --stall-before-step=9 --stall-seconds=6 train" + flags(0, "g0", dp),
          work("w0"));
    });
    const std::string kill = "--kill-rank=" + std::to_string(dp - 1) + " --kill-after-step=3 train";
#ifdef LATTICE_MPIEXEC
    if (mpi) {
      killed = lattice::testing::run_mpi_program(runner, dp, kill + flags(1, "g1-first", dp),
                                                 work("w1"));
      again = lattice::testing::run_mpi(dp, "train" + flags(1, "g1-again", dp), work("w2"));
    }
#endif
    if (!mpi) {
      killed = lattice::testing::run_program(runner, kill + flags(1, "g1-first", dp), work("w1"));
      again = lattice::testing::run_lattice("train" + flags(1, "g1-again", dp), work("w2"));
    }
    group0.join();
    ASSERT_EQ(survivor.status, 0) << survivor.out << survivor.err;
    EXPECT_NE(killed.status, 0) << killed.out << killed.err;
    ASSERT_EQ(again.status, 0) << again.out << again.err;

    // Group 0 trained every step, and went on without group 1 for a while.
    const auto lines0 = lattice::testing::read_jsonl(dir_ / "g0" / "metrics.jsonl");
    ASSERT_EQ(lines0.size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) EXPECT_EQ(lines0[i].at("step").get<int>(), i + 1);
    // Outer step 2 (after step 4) came after the kill: group 0 alone brought trained parameters
    // (group 1's restart, if it was already there, joined with nothing to bring).
    EXPECT_EQ(lines0[3].at("diloco").at("contributors"), nlohmann::json::array({0}));

    // The restarted group took the state group 0 handed over, bit for bit (the hash of its
    // parameters, AdamW moments, outer state and step counts after loading them).
    const auto handed = hand_overs(survivor.out, "handed the job's state to groups 1");
    const auto took = hand_overs(again.out, "took the job's state");
    ASSERT_EQ(took.size(), 1u) << again.out;
    const std::string joined_at = took.begin()->first;
    ASSERT_TRUE(handed.count(joined_at)) << survivor.out;
    EXPECT_EQ(handed.at(joined_at), took.begin()->second);

    // From then on both end every outer step on the same weights.
    const auto lines1 = lattice::testing::read_jsonl(dir_ / "g1-again" / "metrics.jsonl");
    const int first_step = std::stoi(joined_at) * every + 1;
    ASSERT_EQ(lines1.size(), static_cast<size_t>(kSteps - first_step + 1)) << again.out;
    EXPECT_EQ(lines1.front().at("step").get<int>(), first_step);
    int shared = 0;
    for (const auto& line : lines1) {
      const int step = line.at("step").get<int>();
      if (step % every != 0) continue;
      const auto& mine = line.at("diloco");
      const auto& theirs = lines0[static_cast<size_t>(step - 1)].at("diloco");
      EXPECT_EQ(mine.at("members"), nlohmann::json::array({0, 1})) << step;
      EXPECT_EQ(mine.at("weights_hash"), theirs.at("weights_hash")) << step;
      ++shared;
    }
    EXPECT_GE(shared, 2);

    // Every block handed out and brought back exactly once (group 0 took part in every exchange:
    // its records list what every contributor brought back), and no gap below the highest; what
    // the other two processes say they brought back is among them.
    std::map<int64_t, int> brought;
    for (const auto& line : lines0)
      if (line.at("diloco").contains("completed"))
        for (const auto& block : line.at("diloco").at("completed")) ++brought[block.get<int64_t>()];
    ASSERT_FALSE(brought.empty());
    const int64_t highest = brought.rbegin()->first;
    for (int64_t b = 0; b <= highest; ++b) EXPECT_EQ(brought[b], 1) << "block " << b;
    for (const fs::path& run : {dir_ / "g1-first", dir_ / "g1-again"})
      for (const auto& line : lattice::testing::read_jsonl(run / "metrics.jsonl"))
        if (line.at("diloco").value("completed_block", int64_t{-1}) >= 0)
          EXPECT_EQ(brought[line.at("diloco").at("completed_block").get<int64_t>()], 1) << run;
    // Two groups for most of 7 outer steps: more blocks than one group alone would train.
    EXPECT_GT(highest + 1, kSteps / every);
  }

  void SetUp() override {
    CorpusDirectoryTest::SetUp();
    if (!EtcdProcess::available()) GTEST_SKIP() << "no etcd installed (Debian's etcd-server)";
    etcd_.emplace();
  }

  // std::optional keeps the store from starting where the test is skipped.
  struct Store {
    std::optional<EtcdProcess> process;
    void emplace() { process.emplace(); }
    std::string endpoint() const { return process->endpoint(); }
  } etcd_;
  int inner_ = 2;
  std::string extra_;
};

}  // namespace

TEST_F(DilocoFaultTest, AGroupKilledOnThreadsIsLeftOutAndItsRestartTakesTheJobsState) {
  run_and_check(/*mpi=*/false, /*dp=*/1, /*inner=*/2);
}

// The same with synchronous replica groups: a quorum every step, the gradients averaged.
TEST_F(DilocoFaultTest, ASynchronousGroupKilledIsLeftOutAndItsRestartTakesTheJobsState) {
  run_and_check(/*mpi=*/false, /*dp=*/1, /*inner=*/0);
}

// The same under Streaming DiLoCo: 2 fragments of H = 4 (a round every 2 steps), each exchange
// overlapped with one inner step, in fp4. Group 1 dies just before a round's start; the round
// goes on without it; the restart joins a round and takes the whole state; afterwards both end
// every round on the same global fragment.
TEST_F(DilocoFaultTest, AStreamingGroupKilledIsLeftOutAndItsRestartTakesTheJobsState) {
  run_and_check(/*mpi=*/false, /*dp=*/1, /*inner=*/4,
                " --diloco.fragments=2 --diloco.overlap_steps=1 --diloco.exchange=fp4",
                /*every=*/2);
}

#ifdef LATTICE_MPIEXEC
TEST_F(DilocoFaultTest, AGroupKilledUnderMpirunIsLeftOutAndItsRestartTakesTheJobsState) {
  run_and_check(/*mpi=*/true, /*dp=*/2, /*inner=*/2);
}
#endif
