// Tensor parallelism through the `lattice` CLI (issue #21): `lattice parity` with tp layouts
// composed with dp and ZeRO on local threads and under real mpirun (also over TCP), for the GPT-2
// and Llama presets; a tp run's checkpoint holds the logical tensors, so a one-rank run resumes
// it and `lattice generate` reads it, and a tp run resumes its own checkpoint bit-identically; the
// training line and JSONL report the exposed tp communication; `lattice bench tp` runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "../train/checkpoint_tensors.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "mpi_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// A 2-layer model of 4 heads (Llama: 4 key/value heads, so tp 4 splits them too) on 32-token
// sequences, 4 steps.
std::string tiny_flags(const fs::path& dir, const std::string& preset,
                       const std::string& precision = "fp32") {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32 --model.n_kv_heads=4"
         " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
         " --training.precision=" +
         precision +
         " --training.steps=4 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1"
         " --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --parallelism.bucket_mb=0.05 --job.run_dir=" +
         (dir / "run").string();
}

class TpCli : public CorpusDirectoryTest {};

}  // namespace

TEST_F(TpCli, ParityOfTensorParallelLayoutsOnLocalThreads) {
  // The matrix in fp32 over 20 steps: tp 2 and 4, sequence parallelism off and on, dp 1
  // and 2, ZeRO 0, 1 and 3. tp changes the row-parallel layers' sum order (sequence parallelism
  // too: reduce-scatters for all-reduces, the norms' weight gradients summed from each rank's
  // rows; dp the gradients'), so relative 1e-4 against one rank (measured at most 3e-6 in the
  // parameters, 4e-7 in the gradient norms); ZeRO on the same dp x tp (and sp) changes only where
  // state lives: bit for bit.
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"}) {
    SCOPED_TRACE(preset);
    CliResult r = run_lattice(
        "parity --json --layouts "
        "dp1,dp1t2,dp1t2s,dp1t4,dp1t4s,dp2t2,dp2t2s,dp2t2z1,dp2t2sz1,dp2t2z3,dp2t2sz3 "
        "--tolerance 1e-4" +
            tiny_flags(dir_, preset) + " --training.steps=20",
        dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_TRUE(parity_holds(r.out)) << r.out;
    for (const char* layout : {"dp1t2", "dp1t2s", "dp1t4", "dp1t4s", "dp2t2", "dp2t2s"})
      EXPECT_EQ(parity_verdict(r.out, layout), "within_tolerance") << layout << "\n" << r.out;
    for (const char* layout : {"dp2t2z1", "dp2t2sz1", "dp2t2z3", "dp2t2sz3"})
      EXPECT_EQ(parity_verdict(r.out, layout), "bit_identical") << layout << "\n" << r.out;
  }
}

TEST_F(TpCli, ParityWithHsdpAndGradientAccumulation) {
  // dp 4 x tp 2 with ZeRO-3 over HSDP shard groups of 2 (8 ranks), and 2 accumulation steps: the
  // tensor-parallel all-reduces run inside every microbatch, the data-parallel reduction after the
  // last. HSDP sums within groups first, so it is within the tolerance of plain ZeRO on 8 ranks.
  CliResult r = run_lattice(
      "parity --json --layouts dp1,dp1t2,dp4t2,dp4t2z3h2,dp4t2s,dp4t2sz3h2 --tolerance 1e-4" +
          tiny_flags(dir_, "gpt2-tiny") + " --training.gradient_accumulation_steps=2",
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  EXPECT_EQ(parity_verdict(r.out, "dp4t2z3h2"), "within_tolerance") << r.out;
  // And with sequence parallelism (its reductions inside every microbatch as well).
  EXPECT_EQ(parity_verdict(r.out, "dp4t2sz3h2"), "within_tolerance") << r.out;
}

TEST_F(TpCli, ParityInBf16) {
  // bf16, 20 steps at lr 3e-3: tp (and sequence parallelism) reorders fp32 sums whose results are
  // then rounded to bf16, so an activation can land on the neighbouring bf16 (2^-8 relative), and
  // AdamW's normalised update turns a near-zero gradient whose sign changed into a whole step of
  // lr the other way: over 20 steps the parameters drift apart by several lr relative to their
  // scale (measured 1.2e-2 for GPT-2, 1e-3 for Llama), hence 3e-2 for the parameters. The losses
  // and gradient norms average over every element and stay closer: losses within 1e-4 (measured
  // 2.3e-5), gradient norms within 1e-2 (measured 2.8e-3, Llama at tp 4).
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    CliResult r = run_lattice(
        "parity --json --layouts dp1,dp1t2,dp1t2s,dp1t4s,dp2t2,dp2t2s,dp2t2z3,dp2t2sz3 --tolerance "
        "3e-2" +
            tiny_flags(dir_, preset, "bf16") + " --training.steps=20",
        dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_TRUE(parity_holds(r.out)) << r.out;
    for (const char* layout : {"dp2t2z3", "dp2t2sz3"})
      EXPECT_EQ(parity_verdict(r.out, layout), "bit_identical") << r.out;
    for (const char* layout : {"dp1t2", "dp1t2s", "dp1t4s", "dp2t2", "dp2t2s"}) {
      const nlohmann::json entry = parity_layout(r.out, layout);
      ASSERT_TRUE(entry.is_object()) << layout << "\n" << r.out;
      EXPECT_LE(entry.at("loss_rel").get<double>(), 1e-4) << layout;
      EXPECT_LE(entry.at("norm_rel").get<double>(), 1e-2) << layout;
    }
  }
}

TEST_F(TpCli, CheckpointIsLogicalResumesBitIdenticallyAndGenerates) {
  // Overrides after the tiny flags win: each run's directory and step count.
  const auto run = [&](const std::string& dir, const std::string& extra) {
    return run_lattice("train" + tiny_flags(dir_, "gpt2-tiny") + " --metrics.log_freq=1" +
                           " --job.run_dir=" + (dir_ / dir).string() + extra,
                       dir_);
  };
  // 4 steps of `layout` with a checkpoint after step 2 (in run `name`), then a resume from that
  // checkpoint on the same layout (in `name`-resumed): the resumed run's last step prints the same
  // loss as the uninterrupted one, and its final checkpoint holds the same tensors (compared by
  // bytes, not printed). Returns the uninterrupted run.
  const auto expect_bit_identical_resume = [&](const std::string& name, const std::string& layout) {
    CliResult whole = run(name, layout + " --checkpoint.interval=2");
    EXPECT_EQ(whole.status, 0) << whole.out << whole.err;
    const std::string step2 = (dir_ / name / "checkpoints/step_00000002").string();
    CliResult resumed = run(name + "-resumed", layout + " --checkpoint.resume_from=" + step2);
    EXPECT_EQ(resumed.status, 0) << resumed.out << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
    const std::string last = "step      4/4 | loss ";
    const size_t at = whole.out.find(last), resumed_at = resumed.out.find(last);
    EXPECT_NE(at, std::string::npos) << whole.out;
    EXPECT_NE(resumed_at, std::string::npos) << resumed.out;
    if (at != std::string::npos && resumed_at != std::string::npos)
      EXPECT_EQ(whole.out.substr(at, 40), resumed.out.substr(resumed_at, 40));
    EXPECT_TRUE(same_checkpoint_tensors(dir_ / name / "checkpoints/step_00000004",
                                        dir_ / (name + "-resumed") / "checkpoints/step_00000004"))
        << name << ": the resumed run's checkpoint differs";
    return whole;
  };
  const CliResult whole = expect_bit_identical_resume("whole", " --tp 2");
  EXPECT_NE(whole.out.find("tensor parallel: 2 ranks per replica"), std::string::npos) << whole.out;
  // One rank resumes the tp run's (logical) checkpoint, and `generate` reads it.
  CliResult one = run(
      "one", " --checkpoint.resume_from=" + (dir_ / "whole/checkpoints/step_00000002").string());
  EXPECT_EQ(one.status, 0) << one.out << one.err;
  EXPECT_NE(one.out.find("resumed from"), std::string::npos) << one.out;
  CliResult text = run_lattice("generate --checkpoint " + (dir_ / "whole").string() +
                                   " --max-tokens 4 --prompt ab --threads 1",
                               dir_);
  EXPECT_EQ(text.status, 0) << text.out << text.err;
  EXPECT_FALSE(text.out.empty());
  // With sequence parallelism too: the same placements, so the same logical checkpoint format,
  // and a resume that continues bit for bit.
  const CliResult sp =
      expect_bit_identical_resume("whole-sp", " --tp 2 --parallelism.sequence_parallel=true");
  EXPECT_NE(sp.out.find("sequence parallel"), std::string::npos) << sp.out;
}

TEST_F(TpCli, TrainingLineAndJsonlReportTensorParallelCommunication) {
  const auto run = [&](const std::string& dir, const std::string& extra) {
    return run_lattice("train" + tiny_flags(dir_, "gpt2-tiny") + " --metrics.log_freq=1" +
                           " --checkpoint.enable=false --job.run_dir=" + (dir_ / dir).string() +
                           extra,
                       dir_);
  };
  CliResult tp = run("tp", " --tp 2");
  ASSERT_EQ(tp.status, 0) << tp.out << tp.err;
  const auto records = read_jsonl(dir_ / "tp/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u) << tp.out;
  // Every step line shows rank 0's tp all-reduce time; with log_freq 1 a line is one step, so it
  // is that step's JSONL value in milliseconds (to the printed 0.1 ms).
  size_t at = 0;
  for (const auto& record : records) {
    ASSERT_TRUE(record.contains("tp_comm_seconds")) << record.dump();
    const double comm = record["tp_comm_seconds"].get<double>();
    const double step = record["step_seconds"].get<double>();
    EXPECT_GT(comm, 0) << record.dump();
    EXPECT_LT(comm, step) << record.dump();
    at = tp.out.find("| tp comm ", at);
    ASSERT_NE(at, std::string::npos) << tp.out;
    at += std::string("| tp comm ").size();
    const double printed_ms = std::strtod(tp.out.c_str() + at, nullptr);
    EXPECT_EQ(tp.out.compare(tp.out.find(' ', at), 4, " ms\n"), 0) << tp.out.substr(at, 40);
    EXPECT_NEAR(printed_ms, 1e3 * comm, 0.051) << tp.out;
  }
  // One rank has no tensor-parallel communication to report: neither field appears.
  CliResult one = run("one", "");
  ASSERT_EQ(one.status, 0) << one.out << one.err;
  EXPECT_EQ(one.out.find("tp comm"), std::string::npos) << one.out;
  for (const auto& record : read_jsonl(dir_ / "one/metrics.jsonl"))
    EXPECT_FALSE(record.contains("tp_comm_seconds")) << record.dump();
}

TEST_F(TpCli, BenchTpRunsAndPrintsTheRatio) {
  // Tiny and untimed: the command runs both layouts and prints its row (no timing assertions).
  CliResult r = run_lattice(
      "bench tp --model gpt2-tiny --seq-len 32 --batch 4 --steps 1 --warmup 0 --rounds 1", dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ISA:"), std::string::npos) << r.out;
  const size_t row = r.out.find("\ngpt2-tiny (T32 B4)");
  ASSERT_NE(row, std::string::npos) << r.out;
  std::istringstream line(r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1));
  std::string name, shape, precision, ratio;
  double one = 0, two = 0;
  line >> name >> shape >> shape >> precision >> one >> two >> ratio;
  EXPECT_EQ(precision, "fp32") << r.out;
  EXPECT_GT(one, 0) << r.out;
  EXPECT_GT(two, 0) << r.out;
  ASSERT_FALSE(ratio.empty()) << r.out;
  EXPECT_EQ(ratio.back(), 'x') << r.out;
  EXPECT_NEAR(std::strtod(ratio.c_str(), nullptr), two / one, 0.01 + 0.01 * two / one) << r.out;
  // With sequence parallelism: the same row, under its own header.
  CliResult sp = run_lattice(
      "bench tp --model gpt2-tiny --seq-len 32 --batch 4 --steps 1 --warmup 0 --rounds 1 --sp",
      dir_);
  ASSERT_EQ(sp.status, 0) << sp.out << sp.err;
  EXPECT_NE(sp.out.find("tp2sp tok/s"), std::string::npos) << sp.out;
  EXPECT_NE(sp.out.find("\ngpt2-tiny (T32 B4)"), std::string::npos) << sp.out;
  // A model whose heads tp 2 cannot split: one clear error line, before any run.
  expect_one_error_line(run_lattice("bench tp --model gpt2-1.5b --steps 1", dir_),
                        "attention heads");
}

#ifdef LATTICE_MPIEXEC

TEST_F(TpCli, ParityUnderMpirun) {
  // The CI matrix's layouts as MPI processes (4 of them), 20 steps, both presets, the same
  // tolerance and reasons as on threads (ParityOfTensorParallelLayoutsOnLocalThreads).
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    CliResult r =
        run_mpi(4,
                "parity --json --layouts dp1,dp1t2,dp1t2s,dp1t4,dp1t4s,dp2t2,dp2t2s,dp2t2z1,"
                "dp2t2sz3 --tolerance 1e-4" +
                    tiny_flags(dir_, preset) + " --training.steps=20",
                dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("(mpi backend)"), std::string::npos) << r.out;
    EXPECT_TRUE(parity_holds(r.out)) << r.out;
  }
}

TEST_F(TpCli, ParityUnderMpirunOverTcp) {
  // Between nodes' transport; in bf16 too, whose sequence-parallel all-gathers move bf16 rows (the
  // bf16 tolerance's reasons: ParityInBf16).
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    CliResult r = run_mpi(2,
                          std::string("parity --json --layouts dp1,dp1t2,dp1t2s --tolerance ") +
                              (std::string(precision) == "bf16" ? "3e-2" : "1e-4") +
                              tiny_flags(dir_, "gpt2-tiny", precision),
                          dir_, "--mca btl tcp,self");
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_TRUE(parity_holds(r.out)) << r.out;
  }
}
#endif
