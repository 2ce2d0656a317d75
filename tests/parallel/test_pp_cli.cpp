// Pipeline parallelism through the `lattice` CLI (issue #22): `lattice parity` with every schedule
// at pp 2 and 4, alone and composed with dp, ZeRO-1/2, HSDP, tp and sequence parallelism, on local
// threads and under real mpirun; a pipeline run's checkpoint is the one-rank model's (byte for byte
// for an untied model), a one-rank run and the pipeline itself resume it, and `generate` reads it;
// a schedule from a CSV file trains like the generated one; the training line and JSONL report the
// measured bubble, `--metrics.trace` writes a Chrome trace of every rank's actions (the trace of
// other layouts: test_trace_cli.cpp), `lattice bench
// pp` prints its bubbles; bad pipeline settings get one error line each.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../train/checkpoint_tensors.hpp"
#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"
#include "mpi_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// An 8-layer model of 4 heads on 32-token sequences, 4 microbatches per step (the schedules'
// m; interleaving needs a multiple of pp), 4 steps unless a test says otherwise. Llama's embeddings
// are untied, GPT-2's tied.
std::string tiny_flags(const fs::path& dir, const std::string& preset) {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32 --model.n_kv_heads=4 --model.n_layers=8"
         " --training.seq_len=32 --training.global_batch_size=8"
         " --training.gradient_accumulation_steps=4 --training.threads=1"
         " --training.steps=4 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1"
         " --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --parallelism.bucket_mb=0.05 --job.run_dir=" +
         (dir / "run").string();
}

void expect_verdict(const CliResult& r, const std::string& layout, const std::string& verdict) {
  EXPECT_EQ(parity_verdict(r.out, layout), verdict) << layout << " should be " << verdict << ":\n"
                                                    << r.out;
}

class PpCli : public CorpusDirectoryTest {};

}  // namespace

TEST_F(PpCli, EveryScheduleTrainsAsOneRankOnLocalThreads) {
  // The matrix over 20 steps: GPipe, 1F1B, interleaved (2 chunks per rank), ZB-H1 and
  // ZB-V at pp 2 and 4. A pipeline runs every microbatch's arithmetic unchanged, so an untied
  // model's losses and weights are bit-identical to one rank (the gradient norm is held to 1e-12
  // relative: its double partial sums are added per stage, then across stages).
  CliResult r = run_lattice(
      "parity --json --layouts dp1,dp1p2-gpipe,dp1p2,dp1p2-interleaved,dp1p2-zb-h1,dp1p2-zb-v,"
      "dp1p4-gpipe,dp1p4,dp1p4-interleaved,dp1p4-zb-h1,dp1p4-zb-v" +
          tiny_flags(dir_, "llama-tiny") + " --training.steps=20",
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  for (const char* layout :
       {"dp1p2-gpipe", "dp1p2", "dp1p2-interleaved", "dp1p2-zb-h1", "dp1p2-zb-v", "dp1p4-gpipe",
        "dp1p4", "dp1p4-interleaved", "dp1p4-zb-h1", "dp1p4-zb-v"})
    expect_verdict(r, layout, "bit_identical_weights");
}

TEST_F(PpCli, PipelinesInBf16AreBitIdenticalToo) {
  // bf16 GEMMs read the same rounded weights and inputs on a stage as on one rank: the same
  // arithmetic, so the same bits (20 steps).
  CliResult r = run_lattice(
      "parity --json --layouts dp1,dp1p2-gpipe,dp1p2-zb-h1,dp1p4-interleaved,dp1p2-zb-v" +
          tiny_flags(dir_, "llama-tiny") + " --training.precision=bf16 --training.steps=20",
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  for (const char* layout : {"dp1p2-gpipe", "dp1p2-zb-h1", "dp1p4-interleaved", "dp1p2-zb-v"})
    expect_verdict(r, layout, "bit_identical_weights");
}

TEST_F(PpCli, BalancedPartitionTrainsAsOneRank) {
  // A 4096-token vocabulary makes the head cost about 10 blocks (6 d V against 6 x a block's
  // parameters + 12 T d FLOPs per token): balanced by cost, the last of 4 stages keeps one block
  // and the first takes the rest ([5,1,1,1]: the head alone is the most expensive stage, and ties
  // fill the earliest stages), and it trains like one rank.
  const std::string flags = tiny_flags(dir_, "llama-tiny") + " --model.vocab_size=4096";
  CliResult train = run_lattice("train" + flags +
                                    " --pp 4 --parallelism.pipeline_partition=balanced "
                                    "--checkpoint.enable=false --training.steps=1",
                                dir_);
  ASSERT_EQ(train.status, 0) << train.out << train.err;
  EXPECT_NE(train.out.find("4 virtual stages of [5,1,1,1] blocks"), std::string::npos) << train.out;
  // (A listed split's run is checked against one rank's checkpoint in
  // CheckpointIsTheOneRankModelsAndResumes; parity's base config has pp 1, which refuses a list.)
  CliResult r = run_lattice(
      "parity --json --layouts dp1,dp1p4 --parallelism.pipeline_partition=balanced" + flags, dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  expect_verdict(r, "dp1p4", "bit_identical_weights");
}

TEST_F(PpCli, TiedEmbeddingsAcrossStagesStayWithinTolerance) {
  // GPT-2 ties its head to the embedding: the first and last stage each hold a copy and sum their
  // gradients after the backward, where one rank adds the head's and the embedding's parts
  // microbatch by microbatch; the sum order differs, so relative 1e-4 over 20 steps (measured
  // 3e-7 in the parameters after 4 steps). The copies stay equal, so the checkpoint has one tensor.
  CliResult r = run_lattice(
      "parity --json --tolerance 1e-4 --layouts dp1,dp1p2,dp1p4-interleaved,dp1p2-zb-v" +
          tiny_flags(dir_, "gpt2-tiny") + " --training.steps=20",
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  for (const char* layout : {"dp1p2", "dp1p4-interleaved", "dp1p2-zb-v"})
    expect_verdict(r, layout, "within_tolerance");
}

TEST_F(PpCli, ThreeDimensionalLayoutsOnLocalThreads) {
  // dp 2 x tp 2 x pp 2 on 8 ranks, with ZeRO-1/2, sequence parallelism and the split schedules;
  // dp 4 x pp 2 with HSDP. Against the same dp x tp without a pipeline: weights bit-identical; the
  // tp and dp layouts themselves within 1e-4 of one rank (their reasons: test_tp_cli.cpp).
  CliResult r = run_lattice(
      "parity --json --tolerance 1e-4 --layouts "
      "dp1,dp2t2,dp2t2p2,dp2t2p2-gpipez1,dp2t2p2-zb-h1z2,dp2t2s,"
      "dp2t2sp2-zb-vz2,dp2t2sp2-interleavedz1,dp4,dp4p2z1h2" +
          tiny_flags(dir_, "llama-tiny") + " --training.steps=20 --training.global_batch_size=16",
      dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  for (const char* layout : {"dp2t2p2", "dp2t2p2-gpipez1", "dp2t2p2-zb-h1z2", "dp2t2sp2-zb-vz2",
                             "dp2t2sp2-interleavedz1"})
    expect_verdict(r, layout, "bit_identical_weights");
  // HSDP sums within groups first: held to the tolerance against plain dp 4.
  expect_verdict(r, "dp4p2z1h2", "within_tolerance");
}

TEST_F(PpCli, CheckpointIsTheOneRankModelsAndResumes) {
  const auto run = [&](const std::string& dir, const std::string& extra) {
    return run_lattice("train" + tiny_flags(dir_, "llama-tiny") + " --metrics.log_freq=1" +
                           " --job.run_dir=" + (dir_ / dir).string() + extra,
                       dir_);
  };
  CliResult one = run("one", "");
  ASSERT_EQ(one.status, 0) << one.out << one.err;
  CliResult pipe = run("pipe",
                       " --pp 2 --parallelism.pipeline_schedule=zb-h1 "
                       "--checkpoint.interval=2");
  ASSERT_EQ(pipe.status, 0) << pipe.out << pipe.err;
  EXPECT_NE(pipe.out.find("pipeline parallel: 2 ranks, zb-h1 schedule (B and W split)"),
            std::string::npos)
      << pipe.out;
  // The stages' shards are the one-rank model: the same logical tensors (weights and moments),
  // bit for bit.
  EXPECT_TRUE(same_checkpoint_tensors(dir_ / "one/checkpoints/step_00000004",
                                      dir_ / "pipe/checkpoints/step_00000004"))
      << "the pipeline's checkpoint differs from the one-rank run's";
  const std::string step2 = (dir_ / "pipe/checkpoints/step_00000002").string();
  // The pipeline resumes its own checkpoint and ends where the uninterrupted run ended, and so
  // does one rank (on another schedule and partition too).
  for (const std::string& layout :
       {std::string(" --pp 2 --parallelism.pipeline_schedule=zb-h1"), std::string(""),
        std::string(" --pp 4 --parallelism.pipeline_layers=[1,3,3,1]")}) {
    SCOPED_TRACE(layout);
    const std::string name = "resumed" + std::to_string(layout.size());
    CliResult resumed = run(name, layout + " --checkpoint.resume_from=" + step2);
    ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
    EXPECT_TRUE(same_checkpoint_tensors(dir_ / "one/checkpoints/step_00000004",
                                        dir_ / name / "checkpoints/step_00000004", false))
        << resumed.out;
  }
  CliResult text = run_lattice("generate --checkpoint " + (dir_ / "pipe").string() +
                                   " --max-tokens 4 --prompt ab --threads 1",
                               dir_);
  EXPECT_EQ(text.status, 0) << text.out << text.err;
  EXPECT_FALSE(text.out.empty());
}

TEST_F(PpCli, TiedCheckpointHoldsOneEmbeddingAndResumesOnOneRank) {
  const auto run = [&](const std::string& dir, const std::string& extra) {
    return run_lattice(
        "train" + tiny_flags(dir_, "gpt2-tiny") + " --job.run_dir=" + (dir_ / dir).string() + extra,
        dir_);
  };
  CliResult pipe = run("pipe", " --pp 2 --checkpoint.interval=2");
  ASSERT_EQ(pipe.status, 0) << pipe.out << pipe.err;
  const lattice::train::CheckpointReader model((dir_ / "pipe/checkpoints/step_00000004").string());
  EXPECT_TRUE(model.contains("transformer.wte.weight"));
  EXPECT_FALSE(model.contains("lm_head.weight")) << "the head's copy was written";
  // One rank (which has no copy) and a pipeline (whose last stage reads its copy from the
  // embedding) both resume it.
  for (const char* layout : {"", " --pp 2"}) {
    CliResult resumed = run(std::string("resumed") + (*layout ? "-pp" : ""),
                            std::string(layout) + " --checkpoint.resume_from=" +
                                (dir_ / "pipe/checkpoints/step_00000002").string());
    EXPECT_EQ(resumed.status, 0) << resumed.out << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  }
}

TEST_F(PpCli, ScheduleFromACsvFileTrainsLikeTheGeneratedOne) {
  // GPipe on 2 ranks with 2 microbatches, written by hand.
  const fs::path csv = dir_ / "gpipe.csv";
  std::ofstream(csv) << "rank,op,stage,microbatch,peer\n"
                        "0,F,0,0,\n0,SEND_F,0,0,1\n0,F,0,1,\n0,SEND_F,0,1,1\n"
                        "0,RECV_B,0,0,1\n0,B,0,0,\n0,RECV_B,0,1,1\n0,B,0,1,\n"
                        "1,RECV_F,1,0,0\n1,F,1,0,\n1,RECV_F,1,1,0\n1,F,1,1,\n"
                        "1,B,1,0,\n1,SEND_B,1,0,0\n1,B,1,1,\n1,SEND_B,1,1,0\n";
  const auto run = [&](const std::string& dir, const std::string& extra) {
    return run_lattice("train" + tiny_flags(dir_, "llama-tiny") +
                           " --training.gradient_accumulation_steps=2 --job.run_dir=" +
                           (dir_ / dir).string() + extra,
                       dir_);
  };
  CliResult file = run("file", " --pp 2 --parallelism.pipeline_schedule_file=" + csv.string());
  ASSERT_EQ(file.status, 0) << file.out << file.err;
  EXPECT_NE(file.out.find("gpipe.csv"), std::string::npos) << file.out;
  CliResult one = run("one", "");
  ASSERT_EQ(one.status, 0) << one.out << one.err;
  EXPECT_TRUE(same_checkpoint_tensors(dir_ / "one/checkpoints/step_00000004",
                                      dir_ / "file/checkpoints/step_00000004", false));
  // The same list with rank 0's first backward moved before its forwards deadlocks: refused before
  // any work, naming the stuck ranks and actions.
  const fs::path deadlock = dir_ / "deadlock.csv";
  std::ofstream(deadlock) << "rank,op,stage,microbatch,peer\n"
                             "0,RECV_B,0,0,1\n0,B,0,0,\n0,F,0,0,\n0,SEND_F,0,0,1\n0,F,0,1,\n"
                             "0,SEND_F,0,1,1\n0,RECV_B,0,1,1\n0,B,0,1,\n"
                             "1,RECV_F,1,0,0\n1,F,1,0,\n1,RECV_F,1,1,0\n1,F,1,1,\n"
                             "1,B,1,0,\n1,SEND_B,1,0,0\n1,B,1,1,\n1,SEND_B,1,1,0\n";
  CliResult stuck =
      run("stuck", " --pp 2 --parallelism.pipeline_schedule_file=" + deadlock.string());
  expect_one_error_line(stuck, "rank 0");
  // A file for another number of microbatches names the key to change.
  expect_one_error_line(run("other",
                            " --pp 2 --training.gradient_accumulation_steps=4 "
                            "--parallelism.pipeline_schedule_file=" +
                                csv.string()),
                        "training.gradient_accumulation_steps = 2");
}

TEST_F(PpCli, TrainingLineAndJsonlReportTheBubble) {
  CliResult r = run_lattice("train" + tiny_flags(dir_, "llama-tiny") +
                                " --pp 2 --metrics.log_freq=1 --checkpoint.enable=false",
                            dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("| bubble "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| p2p wait "), std::string::npos) << r.out;
  const auto records = read_jsonl(dir_ / "run/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u) << r.out;
  for (const auto& record : records) {
    ASSERT_TRUE(record.contains("pp_bubble")) << record.dump();
    const double bubble = record["pp_bubble"].get<double>();
    EXPECT_GE(bubble, 0.0) << record.dump();
    EXPECT_LT(bubble, 1.0) << record.dump();
    EXPECT_GE(record["pp_wait_seconds"].get<double>(), 0.0) << record.dump();
  }
}

TEST_F(PpCli, ChromeTraceHoldsEveryRanksActions) {
  // pp 2 x dp 2 (4 world ranks), 1F1B, 4 microbatches, 4 steps: every rank's process, its F and B
  // of each microbatch in every step on the compute track, its sends and receive waits on the
  // communication track.
  const fs::path trace = dir_ / "trace.json";
  CliResult r = run_lattice("train" + tiny_flags(dir_, "llama-tiny") +
                                " --pp 2 --dp 2 --training.global_batch_size=16"
                                " --checkpoint.enable=false --metrics.trace=" +
                                trace.string(),
                            dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(trace));
  std::map<int, int> forwards, backwards, communication, names;
  for (const auto& e : j.at("traceEvents")) {
    const int pid = e.at("pid").get<int>();
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") ++names[pid];
      continue;
    }
    const std::string name = e.at("name").get<std::string>();
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    if (name.rfind("F s", 0) == 0) ++forwards[pid];
    if (name.rfind("B s", 0) == 0) ++backwards[pid];
    if (e.at("cat") == "p2p") {
      ++communication[pid];
      EXPECT_TRUE(name.rfind("SEND_", 0) == 0 || name.rfind("RECV_", 0) == 0) << name;
    }
    if (e.at("cat") != "step" && e.at("cat") != "collective")
      EXPECT_NE(name.find(" mb"), std::string::npos) << name;
  }
  for (int pid = 0; pid < 4; ++pid) {
    EXPECT_EQ(names[pid], 1) << pid;
    EXPECT_EQ(forwards[pid], 4 * 4) << pid;  // 4 microbatches x 4 steps
    EXPECT_EQ(backwards[pid], 4 * 4) << pid;
    EXPECT_GE(communication[pid], 4 * 4) << pid;  // a send of each microbatch at least
  }
}

TEST_F(PpCli, BenchPpPrintsMeasuredAnalyticAndReplayedBubbles) {
  // Tiny and untimed: the rows and the analytic column (1F1B at p 2, m 4: 1/5), no timing asserts.
  CliResult r = run_lattice(
      "bench pp --layers 4 --seq-len 32 --micro-batch 1 --microbatches 4 --steps 1 --warmup 0 "
      "--schedule 1f1b,zb-h1",
      dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ISA:"), std::string::npos) << r.out;
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    const size_t at = r.out.find(std::string("\n") + schedule + " ");
    ASSERT_NE(at, std::string::npos) << r.out;
    std::istringstream line(r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1));
    std::string name, measured, analytic, last, replay, ratio;
    line >> name >> measured >> analytic >> last >> replay >> ratio;
    EXPECT_EQ(measured.back(), '%') << r.out;
    EXPECT_EQ(replay.back(), '%') << r.out;
    EXPECT_EQ(ratio.back(), 'x') << r.out;
    EXPECT_EQ(analytic, std::string(schedule) == "1f1b" ? "20.0%" : "-") << r.out;
  }
}

TEST_F(PpCli, StalledStageIsNamedByItsPeersWatchdog) {
  // Rank 0 (the first stage) stalls for 4 s before step 2; the watchdog gives up on a wait after
  // 1.5 s. The last stage, waiting for step 2's first activation, stops with one line naming what
  // it waited for and from which rank, and the run ends (no hang) with an error.
  // The trainer runs under the fault runner, which installs the stall.
  setenv("LATTICE_COMM_TIMEOUT_MS", "1500", 1);
  CliResult r =
      run_program(LATTICE_FAULT_RUNNER,
                  "--stall-rank=0 --stall-before-step=2 --stall-seconds=4 train" +
                      tiny_flags(dir_, "llama-tiny") + " --pp 2 --checkpoint.enable=false",
                  dir_);
  unsetenv("LATTICE_COMM_TIMEOUT_MS");
  EXPECT_NE(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("pipeline rank 1 waited in vain for RECV_F(stage 1, mb 0 <- rank 0)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("step      1/4"), std::string::npos) << r.out;  // step 1 ran
}

TEST_F(PpCli, BadPipelineSettingsGetOneErrorLine) {
  const auto train = [&](const std::string& extra) {
    return run_lattice("train" + tiny_flags(dir_, "llama-tiny") + extra, dir_);
  };
  expect_one_error_line(train(" --pp 16"), "lower pp");
  expect_one_error_line(train(" --pp 2 --parallelism.pipeline_layers=[3,4]"), "sum");
  expect_one_error_line(train(" --pp 2 --parallelism.pipeline_layers=[2,2,4]"),
                        "one block count per stage");
  expect_one_error_line(
      train(" --pp 4 --parallelism.pipeline_schedule=interleaved "
            "--training.gradient_accumulation_steps=2 --training.global_batch_size=4"),
      "multiple of pp");
  expect_one_error_line(train(" --pp 2 --zero 3"), "ZeRO-3");
  expect_one_error_line(train(" --pp 2 --parallelism.pipeline_schedule=zigzag"), "zigzag");
  expect_one_error_line(train(" --pp 2 --parallelism.pipeline_schedule_file=missing.json"),
                        "does not exist");
}

#ifdef LATTICE_MPIEXEC

TEST_F(PpCli, ThreeDimensionalParityUnderMpirun) {
  // Every schedule at pp 2 and 4 as MPI processes, and dp 2 x tp 2 x pp 2 on 8 of them with
  // ZeRO-1/2, sequence parallelism and each schedule; the verdicts and reasons of
  // EveryScheduleTrainsAsOneRankOnLocalThreads and ThreeDimensionalLayoutsOnLocalThreads.
  const char* pipelined[] = {"dp1p2-gpipe",
                             "dp1p2",
                             "dp1p2-interleaved",
                             "dp1p2-zb-h1",
                             "dp1p2-zb-v",
                             "dp1p4-gpipe",
                             "dp1p4",
                             "dp1p4-interleaved",
                             "dp1p4-zb-h1",
                             "dp1p4-zb-v",
                             "dp2t2p2-gpipez1",
                             "dp2t2p2z1",
                             "dp2t2p2-zb-h1z2",
                             "dp2t2sp2-zb-vz2",
                             "dp2t2sp2-interleavedz1"};
  std::string layouts = "dp1,dp2t2,dp2t2s";
  for (const char* layout : pipelined) layouts += std::string(",") + layout;
  CliResult r = run_mpi(8,
                        "parity --json --tolerance 1e-4 --layouts " + layouts +
                            tiny_flags(dir_, "llama-tiny") + " --training.steps=20",
                        dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(mpi backend)"), std::string::npos) << r.out;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
  for (const char* layout : pipelined) expect_verdict(r, layout, "bit_identical_weights");
}

TEST_F(PpCli, PipelineUnderMpirunOverTcp) {
  CliResult r = run_mpi(
      4, "parity --json --layouts dp1,dp1p2,dp1p4-interleaved" + tiny_flags(dir_, "llama-tiny"),
      dir_, "--mca btl tcp,self");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(parity_holds(r.out)) << r.out;
}
#endif
