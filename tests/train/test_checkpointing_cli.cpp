// End-to-end activation checkpointing: `lattice train` with activation_checkpoint.mode = selective
// and full trains to the same losses and gradient norms as none, bit for bit, in fp32 and bf16,
// and the peak activation bytes it measures (metrics.jsonl's memory.peak_activations) are within
// 10% of what `lattice estimate memory --config` predicts for the same run.
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

std::string run_args(const std::string& run_dir, const std::string& precision,
                     const std::string& mode, int interval) {
  return "train --job.run_dir=" + run_dir +
         " --model.preset=gpt2-tiny --model.n_layers=4 --model.vocab_size=256"
         " --model.max_seq_len=64 --training.seq_len=64 --training.micro_batch_size=4"
         " --training.gradient_accumulation_steps=2 --training.threads=1 --training.steps=4"
         " --training.precision=" +
         precision + " --activation_checkpoint.mode=" + mode +
         " --activation_checkpoint.interval=" + std::to_string(interval) +
         " --data.train_files=corpus.txt --data.val_fraction=0.1 --validation.freq=0"
         " --checkpoint.enable=false --metrics.log_freq=1 --metrics.peak_tflops=1";
}

}  // namespace

class CheckpointingCli : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointingCli, RecomputationTrainsToTheSameBitsAndItsMemoryIsEstimated) {
  const std::string precision = GetParam();
  TemporaryDirectory dir("checkpointing-" + precision);
  {
    std::ofstream out(dir.path() / "corpus.txt");
    for (int i = 0; i < 300; ++i) out << "Where there is smoke there is fire. " << i << "\n";
  }
  struct Mode {
    std::string name;
    int interval;
  };
  const std::vector<Mode> modes = {{"none", 1}, {"selective", 1}, {"full", 1}, {"full", 2}};
  std::vector<std::vector<nlohmann::json>> runs;
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name + " " + std::to_string(mode.interval));
    const std::string run = "run-" + mode.name + std::to_string(mode.interval);
    CliResult r = run_lattice(run_args(run, precision, mode.name, mode.interval), dir.path());
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    runs.push_back(read_jsonl(dir.path() / run / "metrics.jsonl"));
    ASSERT_EQ(runs.back().size(), 4u);
    // The estimate for the run's own resolved config.
    CliResult estimate = run_lattice(
        "estimate memory --json --config " + (dir.path() / run / "config.toml").string(),
        dir.path());
    ASSERT_EQ(estimate.status, 0) << estimate.out << estimate.err;
    const auto json = nlohmann::json::parse(estimate.out);
    const double predicted = json["trainer_activations"]["total_bytes"].get<double>();
    const double measured = runs.back().back()["memory"]["peak_activations"].get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, 0.10) << predicted << " vs measured " << measured;
  }
  for (size_t m = 1; m < runs.size(); ++m) {
    for (size_t step = 0; step < runs[0].size(); ++step) {
      // Recomputation is the same arithmetic: exactly the same doubles.
      EXPECT_EQ(runs[m][step]["loss"].get<double>(), runs[0][step]["loss"].get<double>())
          << modes[m].name << " step " << step + 1;
      EXPECT_EQ(runs[m][step]["grad_norm"].get<double>(), runs[0][step]["grad_norm"].get<double>())
          << modes[m].name << " step " << step + 1;
    }
  }
  // Full recomputation keeps fewer activations than none.
  EXPECT_LT(runs[2].back()["memory"]["peak_activations"].get<double>(),
            runs[0].back()["memory"]["peak_activations"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Precisions, CheckpointingCli, ::testing::Values("fp32", "bf16"));
