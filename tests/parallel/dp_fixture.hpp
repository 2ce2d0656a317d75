// Shared by the data-parallel tests: a tiny corpus and config, and a runner that trains a config
// on N local rank threads and returns rank 0's losses, gradient norms and final parameters.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/train/trainer.hpp"

namespace lattice::testing {

struct DpOutcome {
  std::vector<double> losses, grad_norms;
  std::vector<float> parameters;
  double final_val_loss = 0;
};

// A fresh directory holding a small repetitive English corpus (corpus.txt).
inline std::filesystem::path dp_test_directory(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("lattice-dp-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / "corpus.txt");
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n",
                         "A stitch in time saves nine.\n", "All that glitters is not gold.\n",
                         "Where there is smoke there is fire.\n"};
  for (int i = 0; i < 200; ++i) out << lines[i % 4];
  return dir;
}

// A test in a fresh dp_test_directory of its own (named after the test), removed afterwards.
class CorpusDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = dp_test_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// A 2-layer GPT-2 (d_model 64) on 32-token sequences: a step takes milliseconds.
inline train::TrainConfig tiny_dp_config(const std::filesystem::path& dir, int dp, int zero,
                                         int64_t global_batch, int64_t accumulation,
                                         std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "job.run_dir=" +
          (dir / ("run-dp" + std::to_string(dp) + "z" + std::to_string(zero))).string(),
      "model.preset=gpt2-tiny", "model.vocab_size=256", "model.max_seq_len=32",
      "training.seq_len=32", "training.global_batch_size=" + std::to_string(global_batch),
      "training.gradient_accumulation_steps=" + std::to_string(accumulation), "training.threads=1",
      "training.precision=fp32", "training.steps=4", "optimizer.lr=3e-3",
      "lr_scheduler.warmup_steps=1", "data.train_files=" + (dir / "corpus.txt").string(),
      "data.val_fraction=0.1", "validation.freq=0", "metrics.log_freq=100", "metrics.peak_tflops=1",
      "metrics.jsonl=false", "checkpoint.enable=false", "parallelism.dp=" + std::to_string(dp),
      "parallelism.zero=" + std::to_string(zero),
      // Small buckets: several per model, so bucketing and overlap are exercised.
      "parallelism.bucket_mb=0.05"};
  for (auto& e : extra) overrides.push_back(std::move(e));
  return train::load_train_config("", overrides);
}

// `lattice parity --json`'s report in a run's output: its last line that parses as a JSON object
// (null when there is none: the run stopped before comparing).
inline nlohmann::json parity_report(const std::string& out) {
  std::istringstream lines(out);
  nlohmann::json report;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.front() != '{') continue;
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("layouts")) report = std::move(parsed);
  }
  return report;
}

// Whether the report says every layout holds.
inline bool parity_holds(const std::string& out) {
  const nlohmann::json report = parity_report(out);
  return report.is_object() && report.value("ok", false);
}

// One layout's entry in the report (null when absent).
inline nlohmann::json parity_layout(const std::string& out, const std::string& layout) {
  const nlohmann::json report = parity_report(out);
  if (!report.is_object()) return nullptr;
  for (const auto& entry : report.at("layouts"))
    if (entry.value("layout", "") == layout) return entry;
  return nullptr;
}

// A layout's verdict: reference, bit_identical, bit_identical_weights (a pipeline: weights and
// losses bit for bit, the norm regrouped), within_tolerance, differs, out_of_tolerance; "" when
// the layout is not in the report.
inline std::string parity_verdict(const std::string& out, const std::string& layout) {
  const nlohmann::json entry = parity_layout(out, layout);
  return entry.is_object() ? entry.value("verdict", "") : "";
}

// The layout a layout was compared against ("" when absent).
inline std::string parity_reference(const std::string& out, const std::string& layout) {
  const nlohmann::json entry = parity_layout(out, layout);
  return entry.is_object() ? entry.value("reference", "") : "";
}

inline void expect_bit_identical(const DpOutcome& a, const DpOutcome& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << " loss of step " << i + 1;
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << what << " grad norm of step " << i + 1;
  }
  ASSERT_EQ(a.parameters.size(), b.parameters.size()) << what;
  ASSERT_FALSE(a.parameters.empty()) << what;
  size_t differing = 0;
  for (size_t i = 0; i < a.parameters.size(); ++i) differing += a.parameters[i] != b.parameters[i];
  EXPECT_EQ(differing, 0u) << what << ": parameters that differ";
}

// Equal within fp32 rounding of another addition order, amplified by a few AdamW steps: losses
// within 1e-5 and grad norms within 1e-4 relative, every parameter within 1e-4 of the largest
// (Adam's m/sqrt(v) magnifies near-zero gradients' rounding in single parameters).
inline void expect_within_rounding(const DpOutcome& got, const DpOutcome& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * want.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], 1e-4 * want.grad_norms[i])
        << "step " << i + 1;
  }
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  ASSERT_FALSE(want.parameters.empty());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < want.parameters.size(); ++i) {
    scale = std::max(scale, std::abs(want.parameters[i]));
    worst = std::max(worst, std::abs(want.parameters[i] - got.parameters[i]));
  }
  EXPECT_LE(worst, 1e-4f * scale);
}

// Trains `config` on config.dp local rank threads (one kernel thread each).
inline DpOutcome run_dp(const train::TrainConfig& config) {
  DpOutcome out;
  auto body = [&](comm::Communicator* group) {
    omp_set_num_threads(1);
    train::Trainer trainer(config, group);
    train::TrainResult result = trainer.run();
    const model::ParameterStore& params = trainer.full_parameters();
    if (group && group->rank() != 0) return;
    out.losses = result.losses;
    out.grad_norms = result.grad_norms;
    out.final_val_loss = result.final_val_loss;
    out.parameters.assign(params.values(), params.values() + params.size());
  };
  comm::run_local_ranks_or_inline(static_cast<int>(config.parallelism.dp), body);
  return out;
}

}  // namespace lattice::testing
