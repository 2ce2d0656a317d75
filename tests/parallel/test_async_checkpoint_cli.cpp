// Asynchronous checkpoints and kills during a save (issue #25): with checkpoint.async the ranks
// write their files from a snapshot on a thread of their own while training goes on, and the
// checkpoint is published at a later step boundary — the same tensors and losses as synchronous
// saves; a rank killed (SIGKILL) halfway through writing its files, in either mode, on threads or
// as one of several MPI processes, leaves the previous checkpoint the latest and loadable, and the
// next run resumes from it (removing the unpublished staging directory) and ends where an
// uninterrupted run ends, bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../train/checkpoint_tensors.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "lattice/train/checkpoint.hpp"
#include "mpi_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// A 2-layer Llama on 2 data-parallel ranks with ZeRO-1, 6 steps, a checkpoint every 2.
std::string tiny_flags(const fs::path& dir, const std::string& run) {
  return " --model.preset=llama-tiny --model.vocab_size=256 --model.max_seq_len=32"
         " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
         " --training.precision=fp32 --training.steps=6 --optimizer.lr=3e-3"
         " --lr_scheduler.warmup_steps=1 --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --metrics.log_freq=1 --parallelism.bucket_mb=0.05 --checkpoint.interval=2"
         " --zero 1 --job.run_dir=" +
         (dir / run).string();
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  for (const auto& record : read_jsonl(run / "metrics.jsonl"))
    out.push_back(record.at("loss").get<double>());
  return out;
}

class AsyncCheckpointCli : public CorpusDirectoryTest {
 protected:
  // With `kill_rank_1_at_step_4`, the trainer runs under the fault runner, and rank 1 dies
  // halfway through writing step 4's files.
  CliResult train(const std::string& run, const std::string& extra,
                  bool kill_rank_1_at_step_4 = false) {
    const std::string args = "train" + tiny_flags(dir_, run) + " --dp 2" + extra;
    if (!kill_rank_1_at_step_4) return run_lattice(args, dir_);
    return run_program(LATTICE_FAULT_RUNNER,
                       "--kill-during-save-rank=1 --kill-during-save-step=4 " + args, dir_);
  }
};

}  // namespace

TEST_F(AsyncCheckpointCli, BackgroundSavesEqualSynchronousOnes) {
  const CliResult sync = train("sync", " --checkpoint.async=false");
  ASSERT_EQ(sync.status, 0) << sync.out << sync.err;
  const CliResult async = train("async", " --checkpoint.async=true");
  ASSERT_EQ(async.status, 0) << async.out << async.err;
  EXPECT_NE(async.out.find("files written in the background"), std::string::npos) << async.out;
  EXPECT_EQ(losses(dir_ / "sync"), losses(dir_ / "async"));
  // keep_latest = 2: steps 4 and 6 remain, each equal to the synchronous save of the same step.
  for (const char* step : {"step_00000004", "step_00000006"})
    EXPECT_TRUE(same_checkpoint_tensors(dir_ / "sync/checkpoints" / step,
                                        dir_ / "async/checkpoints" / step))
        << step;
  EXPECT_FALSE(fs::exists(dir_ / "async/checkpoints/step_00000002"));
}

TEST_F(AsyncCheckpointCli, AKillDuringASaveLeavesThePreviousCheckpointTheLatest) {
  const CliResult straight = train("straight", "");
  ASSERT_EQ(straight.status, 0) << straight.out << straight.err;
  const std::vector<double> expected = losses(dir_ / "straight");
  for (const char* mode : {"true", "false"}) {
    SCOPED_TRACE(std::string("checkpoint.async=") + mode);
    const std::string run = std::string("killed-") + mode;
    // Rank 1 dies after writing its weights file of step 4's checkpoint, before its moments.
    const CliResult killed = train(run, std::string(" --checkpoint.async=") + mode, true);
    EXPECT_NE(killed.status, 0) << killed.out;
    const fs::path checkpoints = dir_ / run / "checkpoints";
    EXPECT_EQ(lattice::train::latest_checkpoint((dir_ / run).string()),
              (checkpoints / "step_00000002").string());
    EXPECT_FALSE(fs::exists(checkpoints / "step_00000004"));
    bool staged = false;
    for (const auto& entry : fs::directory_iterator(checkpoints))
      staged |= entry.path().filename().string().rfind("step_00000004.tmp-", 0) == 0;
    EXPECT_TRUE(staged) << "the killed save's staging directory";
    // The next run resumes from step 2, removes the staging directory, and ends as the
    // uninterrupted run did.
    const CliResult resumed = train(run, std::string(" --checkpoint.async=") + mode);
    ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from " + (checkpoints / "step_00000002").string()),
              std::string::npos)
        << resumed.out;
    std::vector<double> after = losses(dir_ / run);
    ASSERT_GE(after.size(), 4u);
    after.erase(after.begin(), after.end() - 4);  // steps 3..6 of the resumed run
    EXPECT_EQ(after, std::vector<double>(expected.end() - 4, expected.end()));
    EXPECT_TRUE(same_checkpoint_tensors(dir_ / "straight/checkpoints/step_00000006",
                                        checkpoints / "step_00000006"));
    for (const auto& entry : fs::directory_iterator(checkpoints))
      EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

#ifdef LATTICE_MPIEXEC
TEST_F(AsyncCheckpointCli, AnMpiProcessKilledDuringABackgroundSave) {
  // One of 2 processes dies while writing step 4's files in the background; the other cannot
  // publish without it and is ended (the watchdog or mpirun), never hangs; step 2 stays the latest.
  const std::string flags = tiny_flags(dir_, "mpi") + " --dp -1 --checkpoint.async=true";
  const CliResult killed =
      run_mpi_program(LATTICE_FAULT_RUNNER, 2,
                      "--kill-during-save-rank=1 --kill-during-save-step=4 train" + flags, dir_);
  EXPECT_NE(killed.status, 0) << killed.out << killed.err;
  EXPECT_EQ(lattice::train::latest_checkpoint((dir_ / "mpi").string()),
            (dir_ / "mpi/checkpoints/step_00000002").string());
  const CliResult resumed = run_mpi(2, "train" + flags, dir_);
  ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
}
#endif
