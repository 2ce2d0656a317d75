// Data parallelism and ZeRO on local rank threads, through the trainer: ZeRO-1/2/3 equal plain DP
// bit for bit (the same reduce-scatter on the same bucket layout, the same chunked norm, the same
// elementwise AdamW), DP on N ranks equals one rank within a stated tolerance, per-rank model-state
// bytes equal ZeRO's formulas, checkpoints resume across layouts, and bad settings are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "dp_fixture.hpp"
#include "lattice/core/error.hpp"

using namespace lattice;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = dp_test_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(DataParallelTest, ZeroStagesEqualPlainDataParallelBitForBit) {
  // Two ranks with gradient accumulation over two micro-batches.
  const DpOutcome dp = run_dp(tiny_dp_config(dir_, 2, 0, 8, 2));
  ASSERT_EQ(dp.losses.size(), 4u);
  for (int zero : {1, 2, 3})
    expect_bit_identical(run_dp(tiny_dp_config(dir_, 2, zero, 8, 2)), dp,
                         "dp2 zero " + std::to_string(zero));
}

TEST_F(DataParallelTest, ZeroStagesEqualPlainDataParallelBitForBitInBf16) {
  // bf16: plain DP rounds the weights' bf16 copies in its AdamW pass, ZeRO-1/2 round them again
  // after gathering the updated shards, ZeRO-3 keeps no copies and rounds every weight at each
  // use: the same bf16 operands every way, so the same bits.
  const DpOutcome dp = run_dp(tiny_dp_config(dir_, 2, 0, 8, 2, {"training.precision=bf16"}));
  ASSERT_EQ(dp.losses.size(), 4u);
  for (int zero : {1, 2, 3})
    expect_bit_identical(run_dp(tiny_dp_config(dir_, 2, zero, 8, 2, {"training.precision=bf16"})),
                         dp, "bf16 dp2 zero " + std::to_string(zero));
}

TEST_F(DataParallelTest, ZeroStagesEqualPlainDataParallelOnFourRanks) {
  // Four ranks: the reduction's addition order matters, and is the same for every stage.
  const DpOutcome dp = run_dp(tiny_dp_config(dir_, 4, 0, 8, 1));
  for (int zero : {1, 3})
    expect_bit_identical(run_dp(tiny_dp_config(dir_, 4, zero, 8, 1)), dp,
                         "dp4 zero " + std::to_string(zero));
}

TEST_F(DataParallelTest, DataParallelMatchesOneRankWithinTolerance) {
  const DpOutcome one = run_dp(tiny_dp_config(dir_, 1, 0, 8, 1));
  const DpOutcome two = run_dp(tiny_dp_config(dir_, 2, 0, 8, 1));
  // Same samples and weights; only the order of additions differs (the loss mean over two halves,
  // the gradient sum over ranks), so the results agree to fp32 rounding amplified by 4 AdamW
  // steps (measured: ~1e-7 relative on losses).
  expect_within_rounding(two, one);
  // And training happened: the parameters moved.
  const DpOutcome untrained = run_dp(tiny_dp_config(dir_, 1, 0, 8, 1, {"training.steps=1"}));
  EXPECT_NE(untrained.parameters, one.parameters);
}

TEST_F(DataParallelTest, ModelStateBytesPerRankMatchZeroFormulas) {
  // fp32 parameters and gradients with fp32 Adam moments (our engine keeps no bf16 copies):
  //   DP 4Ψ+4Ψ+8Ψ, ZeRO-1 4Ψ+4Ψ+8Ψ/N (+ the 4Ψ/N reduced gradient shard), ZeRO-2 4Ψ+12Ψ/N,
  //   ZeRO-3 16Ψ/N plus the embedding and head (kept whole), shards padded to 1024 elements.
  const int N = 4;
  for (int zero : {0, 1, 2, 3}) {
    train::TrainConfig config =
        tiny_dp_config(dir_, N, zero, 8, 1, {"model.n_layers=6", "training.steps=1"});
    std::vector<std::array<int64_t, 3>> bytes(N);
    int64_t psi = 0, shard = 0, outer = 0;
    comm::run_local_ranks(N, [&](comm::Communicator& group) {
      omp_set_num_threads(1);
      train::Trainer trainer(config, &group);
      trainer.run();
      const MemoryTracker& m = trainer.memory();
      bytes[static_cast<size_t>(group.rank())] = {m.current(MemoryCategory::parameters),
                                                  m.current(MemoryCategory::gradients),
                                                  m.current(MemoryCategory::optimizer_state)};
      if (group.rank() != 0) return;
      psi = trainer.model().parameters().size();
      for (const auto& b : trainer.data_parallel().layout().buckets()) {
        // Independent of the layout's own bookkeeping: ceil(size / N) rounded up to 1024.
        shard += ((b.size() + N - 1) / N + 1023) / 1024 * 1024;
        if (b.outer) outer += b.size();
      }
    });
    const int64_t P = 4 * psi, S = 4 * shard;
    std::array<int64_t, 3> expected;
    switch (zero) {
      case 0:
        expected = {P, P, 2 * P};
        break;
      case 1:
        expected = {P, P + S, 2 * S};
        break;
      case 2:
        expected = {P, S, 2 * S};
        break;
      default:
        expected = {4 * outer + S, S, 2 * S};
        break;
    }
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(bytes[static_cast<size_t>(r)][0], expected[0]) << "parameters, zero " << zero;
      EXPECT_EQ(bytes[static_cast<size_t>(r)][1], expected[1]) << "gradients, zero " << zero;
      EXPECT_EQ(bytes[static_cast<size_t>(r)][2], expected[2]) << "optimizer, zero " << zero;
    }
    if (zero == 3) {  // and ZeRO-3 really holds far less than DP's 16Ψ
      const int64_t total = expected[0] + expected[1] + expected[2];
      EXPECT_LT(total, 16 * psi / 2);
    }
  }
}

TEST_F(DataParallelTest, CheckpointsAreWholeAndResumeInAnotherLayout) {
  // dp2 ZeRO-3 writes a checkpoint at step 2; dp2 ZeRO-1 resumes it and continues bit-identically
  // to the uninterrupted ZeRO-3 run (same rank count, same arithmetic).
  auto with_checkpoints = [&](int zero, std::vector<std::string> extra) {
    extra.push_back("checkpoint.enable=true");
    extra.push_back("checkpoint.interval=2");
    extra.push_back("job.run_dir=" + (dir_ / "ckpt").string());
    return tiny_dp_config(dir_, 2, zero, 8, 1, extra);
  };
  const DpOutcome full = run_dp(with_checkpoints(3, {"checkpoint.resume=false"}));
  ASSERT_TRUE(fs::exists(dir_ / "ckpt" / "checkpoints" / "step_00000002"));
  const DpOutcome resumed = run_dp(with_checkpoints(
      1, {"checkpoint.resume_from=" + (dir_ / "ckpt" / "checkpoints" / "step_00000002").string()}));
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], full.losses[2]);
  EXPECT_EQ(resumed.losses[1], full.losses[3]);
  EXPECT_EQ(resumed.parameters, full.parameters);
}

TEST_F(DataParallelTest, ReplicaCheckPassesOnHealthyRanks) {
  EXPECT_NO_THROW(run_dp(tiny_dp_config(dir_, 2, 1, 8, 1, {"parallelism.check_replicas=true"})));
}

TEST_F(DataParallelTest, BadSettingsAreOneClearError) {
  auto message = [&](std::vector<std::string> extra) -> std::string {
    try {
      tiny_dp_config(dir_, 2, 0, 8, 1, std::move(extra));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({"parallelism.zero=4"}).find("not a ZeRO stage"), std::string::npos);
  EXPECT_NE(message({"parallelism.bucket_mb=0"}).find("parallelism.bucket_mb"), std::string::npos);
  EXPECT_NE(message({"parallelism.dp=0"}).find("parallelism.dp"), std::string::npos);
  EXPECT_NE(message({"parallelism.backend=\"nccl2\""}).find("parallelism.backend"),
            std::string::npos);
  EXPECT_NE(message({"training.global_batch_size=7"}).find("not divisible"), std::string::npos);
  // A group whose size disagrees with parallelism.dp, and a layout of two ranks given none.
  train::TrainConfig config = tiny_dp_config(dir_, 2, 0, 8, 1);
  try {
    train::Trainer trainer(config);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "parallelism: pp x dp x cp x tp = 1 x 2 x 1 x 1 = 2 ranks are needed: run through "
              "train_on_ranks (lattice train)");
  }
  comm::run_local_ranks(4, [&](comm::Communicator& world) {
    EXPECT_THROW(train::Trainer trainer(config, &world), Error);
  });
}

TEST_F(DataParallelTest, HybridShardingMatchesDataParallelWithinTolerance) {
  // HSDP on 4 ranks, shard groups of 2: reduce-scatter within the group, then allreduce across the
  // two groups — another addition order than plain DP's, so fp32 rounding differs (measured
  // ~1e-7 relative); the two HSDP stages share their arithmetic and agree bit for bit.
  const DpOutcome dp = run_dp(tiny_dp_config(dir_, 4, 0, 8, 1));
  const DpOutcome h3 = run_dp(tiny_dp_config(dir_, 4, 3, 8, 1, {"parallelism.hsdp_shard_size=2"}));
  const DpOutcome h1 = run_dp(tiny_dp_config(dir_, 4, 1, 8, 1, {"parallelism.hsdp_shard_size=2"}));
  expect_bit_identical(h1, h3, "HSDP zero 1 vs zero 3");
  expect_within_rounding(h3, dp);
}

TEST_F(DataParallelTest, OffloadedAdamWStateIsBitIdenticalThroughTheTrainer) {
  // The moments in files (streamed through the same kernel) change nothing, in every stage, and
  // leave no moments in memory.
  for (int zero : {0, 2, 3}) {
    const DpOutcome memory = run_dp(tiny_dp_config(dir_, 2, zero, 8, 1));
    const DpOutcome offloaded = run_dp(tiny_dp_config(
        dir_, 2, zero, 8, 1,
        {"parallelism.offload_dir=" + (dir_ / ("offload" + std::to_string(zero))).string()}));
    expect_bit_identical(offloaded, memory, "offload, zero " + std::to_string(zero));
  }
  ASSERT_TRUE(fs::exists(dir_ / "offload2" / "rank1"));
}

TEST_F(DataParallelTest, ValidationSeesTheSameGlobalBatchesInEveryLayout) {
  // Each rank evaluates its slice of the global validation batch; the means are averaged.
  const std::vector<std::string> validate = {"validation.freq=4", "validation.batches=2"};
  const DpOutcome one = run_dp(tiny_dp_config(dir_, 1, 0, 8, 1, validate));
  const DpOutcome dp = run_dp(tiny_dp_config(dir_, 2, 0, 8, 1, validate));
  const DpOutcome zero3 = run_dp(tiny_dp_config(dir_, 2, 3, 8, 1, validate));
  ASSERT_GT(one.final_val_loss, 0);
  EXPECT_EQ(zero3.final_val_loss, dp.final_val_loss);
  // Same samples and (nearly) the same weights: only rounding differs (see the DP-vs-one test).
  EXPECT_NEAR(dp.final_val_loss, one.final_val_loss, 1e-5 * one.final_val_loss);
}
