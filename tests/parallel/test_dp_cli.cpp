// The parity harness and multi-rank training through the `lattice` CLI: `lattice parity` on the
// local backend (threads) and under real mpirun (processes, also over TCP), `lattice train --dp 2`
// on both backends, and a rank killed mid-training: the job ends with an error naming the rank,
// and the last checkpoint still resumes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "mpi_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

std::string tiny_flags(const fs::path& dir) {
  return " --model.preset=gpt2-tiny --model.vocab_size=256 --model.max_seq_len=32"
         " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
         " --training.precision=fp32 --training.steps=4 --optimizer.lr=3e-3"
         " --lr_scheduler.warmup_steps=1 --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --parallelism.bucket_mb=0.05 --job.run_dir=" +
         (dir / "run").string();
}

class DpCli : public CorpusDirectoryTest {};

}  // namespace

TEST_F(DpCli, ParityOnLocalThreads) {
  CliResult r = run_lattice(
      "parity --json --layouts dp1,dp2,dp2z1,dp2z2,dp2z3,dp4,dp4z2,dp4z3,dp4z3h2 --tolerance 1e-4" +
          tiny_flags(dir_),
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  // Every ZeRO layout is bit-identical to plain DP on the same rank count.
  for (const char* layout : {"dp2z1", "dp2z2", "dp2z3", "dp4z2", "dp4z3"})
    EXPECT_EQ(parity_verdict(r.out, layout), "bit_identical") << layout << "\n" << r.out;
  // HSDP adds in another order: within tolerance of plain DP on 4 ranks.
  EXPECT_EQ(parity_reference(r.out, "dp4z3h2"), "dp4") << r.out;
  EXPECT_EQ(parity_verdict(r.out, "dp4z3h2"), "within_tolerance") << r.out;
}

TEST_F(DpCli, TrainOnTwoLocalRanksPrintsCommunication) {
  CliResult r = run_lattice("train --dp 2 --zero 2 --metrics.log_freq=1" + tiny_flags(dir_), dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("data parallel: 2 ranks (local backend), ZeRO stage 2"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("exposed of"), std::string::npos) << r.out;
}

// The table a person reads and the JSON a script reads report the same verdicts; a layout out of
// tolerance is reported as such in both, with one error line and exit status 2.
TEST_F(DpCli, TableAndJsonAgreeAndAFailureIsReported) {
  const std::string layouts = "parity --layouts dp1,dp2,dp2z1";
  CliResult table = run_lattice(layouts + tiny_flags(dir_), dir_);
  EXPECT_EQ(table.status, 0) << table.out << table.err;
  EXPECT_NE(table.out.find("parity ok"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("\ndp2z1      dp2 "), std::string::npos) << table.out;
  EXPECT_EQ(parity_report(table.out), nullptr) << "no JSON without --json";
  CliResult json = run_lattice(layouts + " --json" + tiny_flags(dir_), dir_);
  EXPECT_EQ(json.status, 0) << json.out << json.err;
  EXPECT_TRUE(parity_holds(json.out)) << json.out;
  EXPECT_EQ(json.out.find("parity ok"), std::string::npos) << "the JSON replaces the table";
  EXPECT_EQ(parity_report(json.out).at("layouts").size(), 3u) << json.out;
  EXPECT_EQ(parity_verdict(json.out, "dp1"), "reference");
  EXPECT_EQ(parity_verdict(json.out, "dp2"), "within_tolerance");
  EXPECT_EQ(parity_verdict(json.out, "dp2z1"), "bit_identical");
  EXPECT_EQ(parity_reference(json.out, "dp2z1"), "dp2");
  // dp2 sums the gradients in another order than dp1: a tolerance of 1e-30 cannot hold.
  CliResult failing = run_lattice(layouts + " --json --tolerance 1e-30" + tiny_flags(dir_), dir_);
  EXPECT_EQ(failing.status, 2) << failing.out << failing.err;
  EXPECT_FALSE(parity_holds(failing.out)) << failing.out;
  EXPECT_EQ(parity_report(failing.out).value("ok", true), false) << failing.out;
  EXPECT_EQ(parity_verdict(failing.out, "dp2"), "out_of_tolerance") << failing.out;
  EXPECT_EQ(parity_verdict(failing.out, "dp2z1"), "bit_identical") << failing.out;
  EXPECT_EQ(failing.err.rfind("error: parity failed for dp2 ", 0), 0u) << failing.err;
}

TEST_F(DpCli, BadLayoutIsOneErrorLine) {
  CliResult r = run_lattice("parity --json --layouts dp2,dpx" + tiny_flags(dir_), dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.rfind("error: layout 'dpx' is not understood", 0), 0u) << r.err;
  r = run_lattice("train --dp 2 --zero 5" + tiny_flags(dir_), dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("parallelism.zero = 5 is not a ZeRO stage"), std::string::npos) << r.err;
}

#ifdef LATTICE_MPIEXEC
TEST_F(DpCli, ParityUnderMpirun) {
  CliResult r = run_mpi(
      4, "parity --json --layouts dp1,dp2,dp2z1,dp2z2,dp2z3,dp4,dp4z1,dp4z3" + tiny_flags(dir_),
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(mpi backend)"), std::string::npos) << r.out;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
}

TEST_F(DpCli, ParityUnderMpirunOverTcp) {
  CliResult r = run_mpi(2, "parity --json --layouts dp1,dp2,dp2z1,dp2z2,dp2z3" + tiny_flags(dir_),
                        dir_, "--mca btl tcp,self");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
}

TEST_F(DpCli, TrainUnderMpirunMatchesLocalThreads) {
  CliResult mpi =
      run_mpi(2, "train --dp -1 --zero 1 --metrics.log_freq=1" + tiny_flags(dir_) + "_mpi", dir_);
  ASSERT_EQ(mpi.status, 0) << mpi.out << mpi.err;
  EXPECT_NE(mpi.out.find("data parallel: 2 ranks (mpi backend)"), std::string::npos) << mpi.out;
  CliResult local =
      run_lattice("train --dp 2 --zero 1 --metrics.log_freq=1" + tiny_flags(dir_) + "_local", dir_);
  ASSERT_EQ(local.status, 0) << local.out << local.err;
  // The final losses agree to the printed digits (the backends' reduction algorithms may differ
  // in the last bit).
  auto final_loss = [](const std::string& out) {
    const size_t at = out.find("final loss ");
    return at == std::string::npos ? std::string() : out.substr(at, 17);
  };
  EXPECT_EQ(final_loss(mpi.out), final_loss(local.out)) << mpi.out << local.out;
}

TEST_F(DpCli, ALayoutThatIsNotTheLaunchersWorldIsOneErrorLine) {
  // The trainer's world is the whole layout, pp x dp x cp x tp ranks.
  CliResult r = run_mpi(2, "train --dp 4" + tiny_flags(dir_), dir_);
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("error: parallelism: pp x dp x cp x tp = 1 x 4 x 1 x 1 = 4 ranks, but the "
                       "launcher started 2: pass --dp 2 (or --dp -1), or start 4 ranks\n"),
            std::string::npos)
      << r.err;
}

TEST_F(DpCli, KilledRankEndsTheJobAndTheLastCheckpointResumes) {
  // The trainer under the fault runner, which kills rank 1 (SIGKILL) after step 3.
  CliResult r = run_mpi_program(LATTICE_FAULT_RUNNER, 2,
                                "--kill-rank=1 --kill-after-step=3 train --dp 2 --zero 2 "
                                "--training.steps=6 --checkpoint.interval=2" +
                                    tiny_flags(dir_),
                                dir_, "", "LATTICE_COMM_TIMEOUT_MS=20000");
  EXPECT_NE(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.status, 124) << "the job hung until the outer timeout";
  const std::string all = r.out + r.err;
  // The dead rank is named either by the survivor's watchdog ("... because rank 1 ... has exited")
  // or, when Open MPI's mpirun notices the SIGKILL first and aborts the job before the survivor
  // reports (a race the test cannot control), by mpirun itself ("process rank 1 ... exited on
  // signal 9"). Either way the job stops with the rank named and no hang.
  const bool survivor_named_it = all.find("because rank 1") != std::string::npos;
  const bool mpirun_named_it = all.find("process rank 1") != std::string::npos &&
                               all.find("exited on signal 9") != std::string::npos;
  EXPECT_TRUE(survivor_named_it || mpirun_named_it) << all;
  ASSERT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "step_00000002")) << all;
  // The surviving checkpoint resumes (on one rank: checkpoints are whole).
  CliResult resumed =
      run_lattice("train --training.steps=3 --checkpoint.interval=0" + tiny_flags(dir_), dir_);
  EXPECT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("at step 2"), std::string::npos) << resumed.out;
}
#endif
