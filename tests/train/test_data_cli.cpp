// End-to-end tests of `lattice data prepare` and `lattice train` on its output: a prepared
// directory trains (and resumes bit-identically, the loader's position coming from the
// checkpoint), the run's config.toml names the dataset, and bad input gets one error line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

class DataCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
    // Two fortune-style files: documents separated by "\n%\n".
    const char* sayings[] = {"The quick brown fox jumps over the lazy dog.",
                             "A stitch in time saves nine.", "All that glitters is not gold.",
                             "Where there is smoke there is fire."};
    for (int f = 0; f < 2; ++f) {
      std::ofstream out(dir_ / ("fortunes" + std::to_string(f)));
      for (int i = 0; i < 100; ++i) out << sayings[(i + f) % 4] << "\n%\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  CliResult prepare(const std::string& extra = "") {
    return run_lattice(
        "data prepare --input 'fortunes*' --tokenizer byte --out ds "
        "--separator '\\n%\\n' --val-fraction 0.1 --threads 2 " +
            extra,
        dir_);
  }
  static std::string tiny_run(const std::string& run_dir) {
    return "train --job.run_dir=" + run_dir +
           " --model.preset=gpt2-tiny --model.vocab_size=256 --model.max_seq_len=32"
           " --training.seq_len=32 --training.micro_batch_size=4 --training.threads=1"
           " --training.precision=fp32 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=2"
           " --data.dataset=ds --validation.freq=5 --validation.batches=2"
           " --metrics.log_freq=1 --metrics.peak_tflops=1";
  }
  fs::path dir_;
};

}  // namespace

TEST_F(DataCli, PrepareWritesShardsAndManifest) {
  CliResult r = prepare();
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("prepared ds: "), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("prepare: encoded"), std::string::npos) << r.err;
  std::ifstream in(dir_ / "ds" / "manifest.json");
  const auto m = nlohmann::json::parse(in);
  EXPECT_EQ(m["documents"]["train"].get<int>() + m["documents"]["val"].get<int>(), 200);
  EXPECT_EQ(m["documents"]["val"].get<int>(), 20);
  EXPECT_EQ(m["tokenizer"], "byte");
  EXPECT_EQ(m["vocab_size"], 256);
  EXPECT_TRUE(fs::exists(dir_ / "ds" / "train_000000.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "ds" / "val_000000.bin"));
}

TEST_F(DataCli, TrainOnPreparedTokensLearnsAndResumesBitIdentically) {
  ASSERT_EQ(prepare().status, 0);
  CliResult r =
      run_lattice(tiny_run("straight") + " --training.steps=30 --checkpoint.interval=15", dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const auto straight = read_jsonl(dir_ / "straight" / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 30u);
  const double first = straight.front()["loss"], last = straight.back()["loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.3);
  EXPECT_LT(last, first - 1.5);
  std::ifstream config(dir_ / "straight" / "config.toml");
  const std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("dataset = 'ds'"), std::string::npos) << text;
  CliResult resumed = run_lattice(
      tiny_run("resumed") +
          " --training.steps=30 --checkpoint.resume_from=straight/checkpoints/step_00000015",
      dir_);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const auto continued = read_jsonl(dir_ / "resumed" / "metrics.jsonl");
  ASSERT_EQ(continued.size(), 15u);
  for (size_t i = 0; i < continued.size(); ++i)
    EXPECT_EQ(continued[i]["loss"].get<double>(), straight[i + 15]["loss"].get<double>()) << i;
}

TEST_F(DataCli, BadInputGetsOneErrorLine) {
  expect_one_error_line(
      run_lattice("data prepare --input 'nothing*' --tokenizer byte --out ds", dir_), "nothing*");
  expect_one_error_line(
      run_lattice("data prepare --input 'fortunes*' --tokenizer no/such.json --out ds", dir_),
      "no/such.json");
  EXPECT_FALSE(fs::exists(dir_ / "ds"));
  expect_one_error_line(
      run_lattice(tiny_run("r") + " --data.dataset=missing --data.format=prepared", dir_),
      "missing");
  ASSERT_EQ(prepare().status, 0);
  expect_one_error_line(run_lattice(tiny_run("r") + " --model.vocab_size=128", dir_),
                        "model.vocab_size >= 256");
}
