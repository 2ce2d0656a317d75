// Checkpoints that reshard into any layout (issue #25): a run trains 2 steps in layout A and writes
// its sharded checkpoint (every rank its own files), a run in layout B resumes it for 2 more steps,
// and B's continuation is compared with A's own continuation of the same state: bit for bit where
// B computes the same arithmetic as A (a ZeRO stage or a pipeline's stage split changes only
// where state lives), else within a stated tolerance (B sums in another order). Every axis that
// exists changes in at least one pair: dp (the loader continues with the next unseen samples of
// the global order), the ZeRO stage, tp, pp and its stage split, cp and ep, and a 3D layout to one
// rank; one checkpoint is written by MPI processes. Also: a damaged latest checkpoint falls back
// to the previous good one with a warning.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../train/checkpoint_tensors.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "mpi_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// A 4-layer model on 32-token sequences, 8 sequences a step in 2 micro-batches, 4 steps, a
// checkpoint every 2.
std::string tiny_flags(const fs::path& dir, const std::string& preset) {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32 --model.n_layers=4"
         " --training.seq_len=32 --training.global_batch_size=8"
         " --training.gradient_accumulation_steps=2 --training.threads=1"
         " --training.precision=fp32 --training.steps=4 --optimizer.lr=3e-3"
         " --lr_scheduler.warmup_steps=1 --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --metrics.log_freq=1 --parallelism.bucket_mb=0.05 --checkpoint.interval=2";
}

struct Pair {
  const char* preset;
  const char* a;  // the layout that writes the checkpoint at step 2
  const char* b;  // the layout that resumes it
  bool exact;     // B's arithmetic is A's: bit for bit
};

// The losses of steps 3 and 4 from a run's JSONL.
std::vector<double> late_losses(const fs::path& run) {
  std::vector<double> losses;
  for (const auto& record : read_jsonl(run / "metrics.jsonl"))
    if (record.at("step").get<int64_t>() > 2) losses.push_back(record.at("loss").get<double>());
  return losses;
}

// The largest difference over all logical tensors, relative to the tensor's largest magnitude.
double max_relative_difference(const fs::path& a, const fs::path& b) {
  const auto x = checkpoint_tensors(a), y = checkpoint_tensors(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (const auto& [name, values] : x) {
    const auto& other = y.at(name);
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(values[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(values[i] - other[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class ReshardCli : public CorpusDirectoryTest {
 protected:
  CliResult train(const std::string& preset, const std::string& run, const std::string& layout,
                  const std::string& extra = "") {
    return run_lattice("train" + tiny_flags(dir_, preset) +
                           " --job.run_dir=" + (dir_ / run).string() + " " + layout + extra,
                       dir_);
  }

  // Resumes run `a_run`'s step-2 checkpoint in B (run `b_run`), and compares B's continuation
  // with A's.
  void check_pair(const Pair& p, const std::string& a_run, const std::string& b_run) {
    SCOPED_TRACE(std::string(p.preset) + ": " + p.a + " -> " + p.b);
    const CliResult b =
        train(p.preset, b_run, p.b,
              " --checkpoint.resume_from=" + (dir_ / a_run / "checkpoints/step_00000002").string());
    ASSERT_EQ(b.status, 0) << b.out << b.err;
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    const std::vector<double> a_losses = late_losses(dir_ / a_run),
                              b_losses = late_losses(dir_ / b_run);
    ASSERT_EQ(a_losses.size(), 2u);
    ASSERT_EQ(b_losses.size(), 2u) << b.out;
    const fs::path a_final = dir_ / a_run / "checkpoints/step_00000004",
                   b_final = dir_ / b_run / "checkpoints/step_00000004";
    if (p.exact) {
      EXPECT_EQ(a_losses, b_losses);
      EXPECT_TRUE(same_checkpoint_tensors(a_final, b_final)) << "weights or moments differ";
      return;
    }
    // Another sum order (dp, tp, cp, ep or pipeline reductions) over two steps of fp32 AdamW:
    // relative 1e-4 (measured at most 3e-8 in the losses and 1e-6 in the state, 2e-5 for
    // GPT-2's tied embedding from a pipeline). Lost moments or a wrong data position would move
    // the state by lr-sized steps and the losses by percent.
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(a_losses[i], b_losses[i], 1e-4 * std::fabs(a_losses[i])) << "step " << i + 3;
    EXPECT_LE(max_relative_difference(a_final, b_final), 1e-4);
  }
};

}  // namespace

TEST_F(ReshardCli, EveryAxisChangesBetweenSaveAndResume) {
  const Pair pairs[] = {
      // The ZeRO stage: the same sums, the state moved between ranks.
      {"llama-tiny", "--dp 2 --zero 1", "--dp 2 --zero 3", true},
      // dp 2 -> 1: the one rank reads the next unseen samples of the global order.
      {"llama-tiny", "--dp 2 --zero 2", "--dp 1", false},
      // tp 1 -> 2 (and dp 1 -> 2 with ZeRO-1).
      {"llama-tiny", "--dp 1", "--dp 2 --tp 2 --zero 1", false},
      // HSDP (ZeRO-3 in shard groups of 2, 2 replicas) -> ZeRO-1 on 2 ranks.
      {"llama-tiny", "--dp 4 --zero 3 --parallelism.hsdp_shard_size=2", "--dp 2 --zero 1", false},
      // Sequence parallelism -> tp without it (the same placements, other reductions).
      {"llama-tiny", "--tp 2 --parallelism.sequence_parallel=true", "--tp 2", false},
      // tp -> pp.
      {"llama-tiny", "--tp 2", "--pp 2", false},
      // A vocabulary of 300 padded to 384 rows at tp 2 (the padding rows are written with their
      // slice and dropped by the reader) -> 1 rank.
      {"llama-tiny", "--tp 2 --model.vocab_size=300", "--model.vocab_size=300", false},
      // A pipeline's stage split and schedule: the same arithmetic.
      {"llama-tiny", "--pp 2 --parallelism.pipeline_layers=[1,3]",
       "--pp 2 --parallelism.pipeline_schedule=zb-h1", true},
      // cp 2 (ring attention) -> dp 2.
      {"llama-tiny", "--cp 2", "--dp 2 --zero 1", false},
      // 3D -> one rank.
      {"llama-tiny", "--dp 2 --tp 2 --pp 2 --zero 1", "--dp 1", false},
      // ep 2 -> 1 with ZeRO-1 on both sides, and a MoE model with GPT-2's tied embedding absent.
      {"mixtral-tiny", "--dp 2 --parallelism.ep=2 --zero 1", "--dp 2 --zero 1", false},
      {"mixtral-tiny", "--dp 2 --zero 2", "--dp 2 --parallelism.ep=2", false},
      // GPT-2 (tied embedding) from a pipeline to tp.
      {"gpt2-tiny", "--pp 2", "--tp 2 --dp 2 --zero 3", false},
  };
  int index = 0;
  for (const Pair& p : pairs) {
    const std::string a_run = "a" + std::to_string(index++);
    const CliResult a = train(p.preset, a_run, p.a);
    ASSERT_EQ(a.status, 0) << p.a << "\n" << a.out << a.err;
    check_pair(p, a_run, a_run + "-resumed");
  }
}

#ifdef LATTICE_MPIEXEC
TEST_F(ReshardCli, ACheckpointOfMpiProcessesResumesOnThreadsInAnotherLayout) {
  // 4 processes (dp 2 x tp 2, ZeRO-1) each write their own files into one checkpoint; threads in
  // two other layouts resume it.
  const CliResult a = run_mpi(4,
                              "train" + tiny_flags(dir_, "llama-tiny") + " --job.run_dir=" +
                                  (dir_ / "mpi").string() + " --dp -1 --tp 2 --zero 1",
                              dir_);
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(fs::exists(dir_ / "mpi/checkpoints/step_00000002" /
                           ("model-rank-0000" + std::to_string(r) + "-of-00004.safetensors")));
  check_pair({"llama-tiny", "--dp 2 --tp 2 --zero 1", "--dp 1", false}, "mpi", "one");
  check_pair({"llama-tiny", "--dp 2 --tp 2 --zero 1", "--pp 2 --dp 2", false}, "mpi", "pp2dp2");
}
#endif

TEST_F(ReshardCli, ADamagedLatestCheckpointFallsBackToThePreviousGoodOne) {
  // 4 steps on 2 ranks, checkpoints at 2 and 4; then step 4's rank-1 file loses a byte's worth of
  // truth. The resumed run (6 steps) warns, naming the damage, and continues from step 2.
  const CliResult a = train("llama-tiny", "run", "--dp 2 --zero 1");
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const fs::path damaged =
      dir_ / "run/checkpoints/step_00000004/model-rank-00001-of-00002.safetensors";
  const auto size = fs::file_size(damaged);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 5));
    f.write("\x7f\x7f", 2);
  }
  // An explicit checkpoint has no fallback: its damage is the error.
  const CliResult explicit_resume =
      train("llama-tiny", "other", "--dp 2 --zero 1",
            " --checkpoint.resume_from=" + (dir_ / "run/checkpoints/step_00000004").string());
  EXPECT_NE(explicit_resume.status, 0);
  EXPECT_NE(explicit_resume.err.find("fails its checksum"), std::string::npos)
      << explicit_resume.err;
  const CliResult resumed = train("llama-tiny", "run", "--dp 2 --zero 1", " --training.steps=6");
  ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.err.find("warning: checkpoint " +
                             (dir_ / "run/checkpoints/step_00000004").string() + " is damaged"),
            std::string::npos)
      << resumed.err;
  EXPECT_NE(resumed.err.find("fails its checksum"), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + (dir_ / "run/checkpoints/step_00000002").string() +
                             " at step 2"),
            std::string::npos)
      << resumed.out;
}
