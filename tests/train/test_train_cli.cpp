// End-to-end tests of `lattice train` and `lattice generate`: a short run learns, resuming from a
// checkpoint continues with bit-identical losses, and bad input gets one clear error line and exit
// 2 without leaving half-written output.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// A small English corpus written into the test directory (repeated sentences: learnable quickly).
void write_corpus(const fs::path& dir) {
  std::ofstream out(dir / "corpus.txt");
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n",
                         "A stitch in time saves nine.\n", "All that glitters is not gold.\n",
                         "Where there is smoke there is fire.\n"};
  for (int i = 0; i < 200; ++i) out << lines[i % 4];
}

// A tiny model and run that finish in a second or two on one thread.
std::string tiny_run(const std::string& run_dir, const std::string& precision = "fp32") {
  return "train --job.run_dir=" + run_dir +
         " --model.preset=gpt2-tiny --model.vocab_size=256 --model.max_seq_len=32"
         " --training.seq_len=32 --training.micro_batch_size=4 --training.threads=1"
         " --training.precision=" +
         precision +
         " --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=2"
         " --data.train_files=corpus.txt --data.val_fraction=0.1 --validation.freq=0"
         " --metrics.log_freq=1 --metrics.peak_tflops=1";
}

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_corpus(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void expect_error(const std::string& args, const std::string& needle) {
    expect_one_error_line(run_lattice(args, dir_), needle);
  }
  fs::path dir_;
};

}  // namespace

TEST_F(TrainCli, ShortRunLearnsAndWritesItsRunDirectory) {
  CliResult r = run_lattice(tiny_run("run") + " --training.steps=30", dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto records = read_jsonl(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 30u);
  const double first = records.front()["loss"], last = records.back()["loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // an untrained byte model is near-uniform
  EXPECT_LT(last, first - 1.5);              // and this repetitive corpus is learned fast
  for (const char* key : {"grad_norm", "lr", "tokens_per_second", "tflops", "mfu", "memory"})
    EXPECT_TRUE(records.back().contains(key)) << key;
  EXPECT_GT(records.back()["memory"]["parameters"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "config.toml"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "step_00000030" / "model.safetensors"));
  EXPECT_NE(r.out.find("MFU"), std::string::npos);
  // Nothing half-written is left behind.
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "run"))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(TrainCli, ResumingFromACheckpointContinuesBitIdentically) {
  // bf16 also reads the weights' bf16 copies, which a resumed run rounds from the loaded weights.
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string straight_dir = "straight_" + precision, resumed_dir = "resumed_" + precision;
    ASSERT_EQ(
        run_lattice(
            tiny_run(straight_dir, precision) + " --training.steps=8 --checkpoint.interval=4", dir_)
            .status,
        0);
    CliResult resumed =
        run_lattice(tiny_run(resumed_dir, precision) +
                        " --training.steps=8 --checkpoint.resume_from=" + straight_dir +
                        "/checkpoints/step_00000004",
                    dir_);
    ASSERT_EQ(resumed.status, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from"), std::string::npos);
    // A bf16 run says where its GEMMs run (AMX, or fp32 units where the CPU has no AMX).
    EXPECT_EQ(resumed.out.find("bf16 GEMMs on ") != std::string::npos, precision == "bf16")
        << resumed.out;
    auto straight = read_jsonl(dir_ / straight_dir / "metrics.jsonl");
    auto continued = read_jsonl(dir_ / resumed_dir / "metrics.jsonl");
    ASSERT_EQ(straight.size(), 8u);
    ASSERT_EQ(continued.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(continued[i]["step"], straight[i + 4]["step"]);
      // Same weights, optimizer state, data position and schedule: the losses are equal bit for
      // bit.
      EXPECT_EQ(continued[i]["loss"].get<double>(), straight[i + 4]["loss"].get<double>());
      EXPECT_EQ(continued[i]["grad_norm"].get<double>(),
                straight[i + 4]["grad_norm"].get<double>());
    }
  }
  // Re-running a finished run resumes from its latest checkpoint and has nothing left to do.
  CliResult again = run_lattice(tiny_run("straight_fp32") + " --training.steps=8", dir_);
  EXPECT_EQ(again.status, 0);
  EXPECT_EQ(read_jsonl(dir_ / "straight_fp32" / "metrics.jsonl").size(), 8u);
}

TEST_F(TrainCli, GenerateSamplesDeterministicallyFromTheCheckpoint) {
  ASSERT_EQ(run_lattice(tiny_run("run") + " --training.steps=20", dir_).status, 0);
  const std::string args =
      "generate --checkpoint run --prompt 'The ' --max-tokens 24 --seed 3 --threads 1";
  CliResult a = run_lattice(args, dir_), b = run_lattice(args, dir_);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.rfind("The ", 0), 0u);
  EXPECT_EQ(a.out.size(), 4u + 24u + 1u);  // prompt + 24 bytes + newline
  CliResult greedy = run_lattice(
      "generate --checkpoint run --prompt 'The ' --max-tokens 8 "
      "--temperature 0 --threads 1",
      dir_);
  EXPECT_EQ(greedy.status, 0);
}

TEST_F(TrainCli, UnknownKeyIsNamedWithTheClosestKeyAndHowToListThem) {
  expect_error(tiny_run("r") + " --training.stepz=3",
               "unknown config key training.stepz (command-line override): did you mean "
               "training.steps? `lattice train --help-config` lists every key");
  std::ofstream(dir_ / "bad.toml") << "[trainign]\nsteps = 3\n";
  expect_error("train bad.toml",
               "unknown config section [trainign] in bad.toml: did you mean [training]?");
  std::ofstream(dir_ / "misplaced.toml") << "[training]\nlr = 0.1\n";
  expect_error("train misplaced.toml",
               "unknown config key training.lr in misplaced.toml: did you mean optimizer.lr?");
}

TEST_F(TrainCli, AnUnknownBf16FallbackIsNamedAndNothingIsWritten) {
  // The child inherits the variable; restored before any assertion can return.
  const char* previous = std::getenv("LATTICE_MATMUL_BF16_FALLBACK");
  const std::string kept = previous != nullptr ? previous : "";
  setenv("LATTICE_MATMUL_BF16_FALLBACK", "bogus", 1);
  const CliResult r = run_lattice(tiny_run("fallback", "bf16"), dir_);
  if (previous != nullptr)
    setenv("LATTICE_MATMUL_BF16_FALLBACK", kept.c_str(), 1);
  else
    unsetenv("LATTICE_MATMUL_BF16_FALLBACK");
  expect_one_error_line(r, "LATTICE_MATMUL_BF16_FALLBACK=bogus is not a choice: use onednn");
  EXPECT_FALSE(fs::exists(dir_ / "fallback"));
}

TEST_F(TrainCli, WrongTypeIsNamed) {
  std::ofstream(dir_ / "bad.toml") << "[training]\nsteps = \"many\"\n";
  expect_error("train bad.toml", "config key training.steps must be an integer, got a string");
  std::ofstream(dir_ / "broken.toml") << "[training\nsteps = 3\n";
  expect_error("train broken.toml", "is not valid TOML (line 1");
  expect_error("train missing.toml", "cannot read config file missing.toml");
}

TEST_F(TrainCli, InconsistentBatchSizesNameTheKeys) {
  expect_error(tiny_run("r") +
                   " --training.global_batch_size=10 --training.gradient_accumulation_steps=2"
                   " --training.micro_batch_size=4",
               "training.global_batch_size (10) must equal micro_batch_size (4)");
  expect_error(tiny_run("r") +
                   " --training.global_batch_size=10 --training.micro_batch_size=4"
                   " --training.gradient_accumulation_steps=0",
               "is not divisible by micro_batch_size");
}

TEST_F(TrainCli, ModelsThatDoNotFitAreRefused) {
  expect_error(tiny_run("r") + " --model.n_heads=5", "not divisible by model.n_heads");
  expect_error(tiny_run("r") + " --training.seq_len=64", "training.seq_len (64) must be in");
  expect_error(tiny_run("r") + " --model.vocab_size=100", "model.vocab_size >= 256");
  expect_error(tiny_run("r") + " --pp 4",
               "4 stages need at least one block each, but the model has 2 layers");
}

TEST_F(TrainCli, MissingCorpusOrCheckpointIsNamed) {
  expect_error(tiny_run("r") + " --data.train_files=nothing*.txt",
               "corpus file pattern 'nothing*.txt' matches no readable file");
  expect_error("generate --checkpoint nowhere", "checkpoint nowhere does not exist");
  expect_error(tiny_run("r") + " --checkpoint.resume_from=nowhere",
               "checkpoint nowhere does not exist");
  EXPECT_FALSE(fs::exists(dir_ / "r" / "checkpoints"));
}

TEST_F(TrainCli, CorruptOrTruncatedCheckpointIsRefusedAndLeftIntact) {
  ASSERT_EQ(run_lattice(tiny_run("run") + " --training.steps=4", dir_).status, 0);
  const fs::path model = dir_ / "run" / "checkpoints" / "step_00000004" / "model.safetensors";
  const auto full = fs::file_size(model);
  fs::resize_file(model, full / 2);
  expect_error(tiny_run("run") + " --training.steps=8", "truncated");
  expect_error("generate --checkpoint run", "truncated");
  EXPECT_EQ(fs::file_size(model), full / 2);  // refused, not overwritten
  // A damaged header.
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("#####", 5);
  }
  expect_error("generate --checkpoint run", "model.safetensors");
  // A pointer to a checkpoint that is gone.
  fs::remove_all(dir_ / "run" / "checkpoints" / "step_00000004");
  expect_error(tiny_run("run") + " --training.steps=8", "does not exist");
}
