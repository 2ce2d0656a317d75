// Mixture-of-experts training through the `lattice` CLI (issue #24): mixtral-tiny trains and its
// training line and JSONL carry the routing (tokens per expert, load, losses); `lattice parity`
// holds MoE models to one rank across data parallelism, ZeRO 1-3, context parallelism and
// pipelines (the load-balancing loss spans the batch group, so dp2 equals dp1 on the same global
// batch); capacity mode drops the same copies wherever each rank sees the same micro-batch.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// A tiny MoE preset on 32-token sequences, 10 steps of a global batch of 8.
std::string moe_flags(const fs::path& dir, const std::string& preset,
                      const std::string& extra = "") {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32 --training.seq_len=32"
         " --training.global_batch_size=8 --training.threads=1 --training.precision=fp32"
         " --training.steps=10 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1"
         " --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --parallelism.bucket_mb=0.05 --job.run_dir=" +
         (dir / "run").string() + extra;
}

using MoeCli = CorpusDirectoryTest;

void expect_verdict(const CliResult& r, const std::string& layout, const std::string& verdict) {
  EXPECT_NE(parity_line(r.out, layout).find(verdict), std::string::npos)
      << layout << " should be " << verdict << "\n"
      << r.out;
}

}  // namespace

TEST_F(MoeCli, TrainsAndReportsTheRoutingInTheLineAndTheJsonl) {
  const CliResult r =
      run_lattice("train" + moe_flags(dir_, "mixtral-tiny", " --training.steps=30"), dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("| moe load "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" aux 0.0"), std::string::npos) << r.out;  // the preset's coefficient 0.01
  std::ifstream jsonl(dir_ / "run" / "metrics.jsonl");
  std::string line, last;
  double first_loss = -1;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    if (first_loss < 0) first_loss = j.at("loss").get<double>();
    last = line;
  }
  ASSERT_FALSE(last.empty());
  const auto j = nlohmann::json::parse(last);
  EXPECT_LT(j.at("loss").get<double>(), first_loss - 0.5);  // it learns
  const auto& layers = j.at("moe").at("layers");
  ASSERT_EQ(layers.size(), 2u);  // both layers of mixtral-tiny are MoE layers
  for (const auto& layer : layers) {
    int64_t copies = 0, most = 0;
    for (const auto& count : layer.at("tokens_per_expert")) {
      copies += count.get<int64_t>();
      most = std::max(most, count.get<int64_t>());
    }
    EXPECT_EQ(copies, 8 * 32 * 2);  // every token of the step's batch, top-2
    EXPECT_DOUBLE_EQ(layer.at("max_mean_load").get<double>(), most / (copies / 4.0));
    EXPECT_EQ(layer.at("dropped_fraction").get<double>(), 0.0);  // dropless
    // A balanced router gives exactly the coefficient; an unbalanced one more.
    EXPECT_GE(layer.at("aux_loss").get<double>(), 0.01 * 0.99);
  }
}

// The balancing loss's loads are summed over the batch group: data and context parallelism equal
// one rank within the gradient sum order's rounding; ZeRO and pipelines change no arithmetic.
TEST_F(MoeCli, ParityAcrossDataContextAndPipelineParallelism) {
  const CliResult r = run_lattice("parity --layouts dp1,dp2,dp2z1,dp2z3,dp1c2,dp1c2u,dp1p2,dp2p2" +
                                      moe_flags(dir_, "mixtral-tiny"),
                                  dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("parity ok"), std::string::npos) << r.out;
  for (const char* layout : {"dp2", "dp1c2", "dp1c2u"})
    expect_verdict(r, layout, "within tolerance");
  for (const char* layout : {"dp2z1", "dp2z3"}) expect_verdict(r, layout, "bit-identical");
  for (const char* layout : {"dp1p2", "dp2p2"}) expect_verdict(r, layout, "bit-identical weights");
}

// DeepSeek-style (a shared expert, sigmoid scores, every second layer MoE, 4 layers) with a
// capacity: wherever each rank routes the same micro-batch — a zero-bubble pipeline against one
// rank, ZeRO-2 against plain dp2 — the same copies are dropped and the runs agree bit for bit. The
// capacity is each rank's (as Megatron-LM's per-rank capacity): dp2 or cp2 drop within their own
// part of the batch, so they are not compared with one rank here.
TEST_F(MoeCli, CapacityModeParityWhereTheMicroBatchesAreTheSame) {
  const CliResult r =
      run_lattice("parity --layouts dp1,dp1p2-zb-v,dp2,dp2z2 --tolerance 1" +
                      moe_flags(dir_, "deepseek-moe-tiny",
                                " --model.n_layers=4 --model.moe_capacity_factor=1.25"
                                " --model.moe_z_loss_coef=0.001"),
                  dir_);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("parity ok"), std::string::npos) << r.out;
  expect_verdict(r, "dp1p2-zb-v", "bit-identical weights");
  expect_verdict(r, "dp2z2", "bit-identical");
}
