// Simulator, planner, trace and CLI behaviour: determinism, speed on a 3072-GPU layout, the
// mechanisms moving the numbers the right way, Chrome-trace structure, and the verbs' JSON and
// errors.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "lattice/core/error.hpp"
#include "lattice/plan/planner.hpp"
#include "lattice/plan/simulator.hpp"
#include "lattice/plan/timeline.hpp"

namespace lattice::plan {
namespace {

ParallelLayout megatron_1t_layout() {
  ParallelLayout l;
  l.tp = 8;
  l.pp = 64;
  l.dp = 6;
  l.global_batch_size = 3072;
  l.recompute = Recompute::kFull;
  return l;
}

TEST(Simulator, DeterministicAndFastOn3072Gpus) {
  HardwareCatalog catalog;
  const auto start = std::chrono::steady_clock::now();
  const SimulationResult a =
      simulate(model_preset("megatron-1t"), megatron_1t_layout(), catalog.get("a100-80gb"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
  const SimulationResult b =
      simulate(model_preset("megatron-1t"), megatron_1t_layout(), catalog.get("a100-80gb"));
  EXPECT_EQ(a.step_seconds, b.step_seconds);
  EXPECT_EQ(a.schedule.actions.size(), 64u);
  EXPECT_GT(a.bubble_fraction, 0.0);
}

TEST(Simulator, UnevenStagesAsLlama3405bWasTrained) {
  // 126 layers on 16 pipeline stages (Llama 3 405B's layout: tp 8, pp 16): the stages hold 7, 8 x
  // 14, 7 blocks (pipeline::even_partition), in the memory estimate and in the simulator alike.
  HardwareCatalog catalog;
  const ModelSpec model = model_preset("llama3-405b");
  ASSERT_EQ(model.n_layers, 126);
  ParallelLayout l;
  l.tp = 8;
  l.pp = 16;
  l.dp = 4;
  l.global_batch_size = 256;
  l.recompute = Recompute::kSelective;
  const MemoryEstimate memory = estimate_memory(model, l);
  ASSERT_EQ(memory.stages.size(), 16u);
  const ParameterCount count = count_parameters(model);
  // A middle rank holds 8 blocks' parameters (its tp shard; a dense MLP counts as one expert),
  // the second rank as many: no edge. The first rank: 7 blocks and the embedding.
  const double block = static_cast<double>(count.per_layer_dense + count.per_layer_experts);
  EXPECT_DOUBLE_EQ(memory.stages[1].parameters, 8 * block / l.tp);
  EXPECT_DOUBLE_EQ(memory.stages[7].parameters, 8 * block / l.tp);
  EXPECT_DOUBLE_EQ(memory.stages[0].parameters,
                   7 * block / l.tp + static_cast<double>(count.embedding) / l.tp);
  EXPECT_LT(memory.stages[0].activation_bytes, memory.stages[1].activation_bytes);
  const SimulationResult r = simulate(model, l, catalog.get("h100-sxm"));
  EXPECT_TRUE(r.replay.completed);
  EXPECT_GT(r.model_tflops_per_device, 0.0);
}

TEST(Simulator, MechanismsMoveThroughputTheRightWay) {
  HardwareCatalog catalog;
  const HardwareSpec& a100 = catalog.get("a100-80gb");
  const ModelSpec m = model_preset("megatron-39.1b");
  ParallelLayout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 2;
  l.global_batch_size = 64;
  const SimulationResult base = simulate(m, l, a100);
  // Full recomputation costs about one more forward: slower steps, same model FLOPs.
  ParallelLayout full = l;
  full.recompute = Recompute::kFull;
  const SimulationResult recomputed = simulate(m, full, a100);
  EXPECT_GT(recomputed.step_seconds, base.step_seconds * 1.15);
  EXPECT_NEAR(recomputed.model_flops_per_step, base.model_flops_per_step, 1);
  // Interleaving shrinks the bubble.
  ParallelLayout interleaved = l;
  interleaved.schedule = pipeline::ScheduleKind::kInterleaved;
  interleaved.virtual_stages = 2;
  EXPECT_LT(simulate(m, interleaved, a100).bubble_fraction, base.bubble_fraction);
  // More microbatches per pipeline shrink the bubble.
  ParallelLayout bigger = l;
  bigger.global_batch_size = 256;
  EXPECT_LT(simulate(m, bigger, a100).bubble_fraction, base.bubble_fraction);
  // Zero-bubble schedules beat 1F1B; ZB-V puts embedding and head on rank 0.
  ParallelLayout zbh1 = l;
  zbh1.schedule = pipeline::ScheduleKind::kZeroBubbleH1;
  const SimulationResult h1 = simulate(m, zbh1, a100);
  EXPECT_LT(h1.step_seconds, base.step_seconds);
  ParallelLayout zbv = l;
  zbv.schedule = pipeline::ScheduleKind::kZeroBubbleV;
  zbv.virtual_stages = 2;
  EXPECT_LT(simulate(m, zbv, a100).step_seconds, h1.step_seconds);
  EXPECT_GT(estimate_memory(m, zbv).stages[0].temporary_bytes,
            estimate_memory(m, zbv).stages[3].temporary_bytes);
  // H100 is faster than A100 on the same layout.
  EXPECT_LT(simulate(m, l, catalog.get("h100-sxm")).step_seconds, base.step_seconds);
  // Overlapping the gradient reduction never hurts.
  ParallelLayout overlapped = l;
  overlapped.overlap_grad_reduce = true;
  EXPECT_LE(simulate(m, overlapped, a100).dp_exposed_seconds, base.dp_exposed_seconds);
  EXPECT_THROW(simulate(
                   m,
                   [&] {
                     auto x = l;
                     x.tp = 16;
                     return x;
                   }(),
                   a100),
               Error);
}

TEST(Simulator, FlashAttentionRemovesScoreTrafficAndStorage) {
  HardwareCatalog catalog;
  ModelSpec m = model_preset("llama3-8b");
  m.seq_len = 32768;
  ParallelLayout l;
  l.tp = 8;
  l.sequence_parallel = true;
  l.global_batch_size = 1;
  ParallelLayout flash = l;
  flash.flash_attention = true;
  const double s = 32768, b = 1, a = 32, h = 4096, t = 8;
  // Without flash the softmax output (2 bytes per score; Llama has no dropout) is stored.
  EXPECT_NEAR(activation_bytes_per_layer(m, l) - activation_bytes_per_layer(m, flash),
              b * a * s * s * 2 / t - b * a * s * 4 / t, 1.0);
  EXPECT_GT(s * b * h, 0);
  const HardwareSpec& h100 = catalog.get("h100-sxm");
  EXPECT_LT(simulate(m, flash, h100).step_seconds, 0.8 * simulate(m, l, h100).step_seconds);
}

TEST(Simulator, ChromeTraceHasOnePidPerPipelineRank) {
  HardwareCatalog catalog;
  ParallelLayout l;
  l.pp = 4;
  l.global_batch_size = 8;
  const SimulationResult r = simulate(model_preset("gpt2-350m"), l, catalog.get("h100-sxm"));
  const nlohmann::json trace = chrome_trace(r, l);
  std::set<int> pids;
  int forwards = 0;
  for (const auto& event : trace["traceEvents"]) {
    pids.insert(event["pid"].get<int>());
    if (event["ph"] == "X" && event["name"].get<std::string>().starts_with("F")) ++forwards;
  }
  EXPECT_EQ(pids.size(), 4u);
  EXPECT_EQ(forwards, 4 * 8);
  const std::string ascii = ascii_timeline(r.replay, 40);
  EXPECT_NE(ascii.find("rank  3 |"), std::string::npos);
  EXPECT_NE(ascii.find('A'), std::string::npos);
  EXPECT_NE(ascii.find('a'), std::string::npos);
}

TEST(Planner, FindsFittingLayoutsFastestFirst) {
  HardwareCatalog catalog;
  PlanRequest request;
  request.model = model_preset("gpt3-175b");
  request.hardware = catalog.get("a100-80gb");
  request.devices = 1024;
  request.global_batch_size = 1536;
  request.top = 10;
  const auto start = std::chrono::steady_clock::now();
  const PlanResult result = plan_layouts(request);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_EQ(result.best.size(), 10u);
  for (size_t i = 1; i < result.best.size(); ++i)
    EXPECT_LE(result.best[i - 1].step_seconds, result.best[i].step_seconds);
  for (const auto& p : result.best) {
    EXPECT_LE(p.peak_memory_bytes, 0.9 * request.hardware.memory_bytes);
    EXPECT_EQ(p.layout.world_size(), 1024);
  }
  EXPECT_GT(result.best[0].mfu, 0.3);
  EXPECT_NE(result.rationale.find("faster than"), std::string::npos) << result.rationale;

  request.model = model_preset("llama3-405b");
  request.devices = 8;
  request.global_batch_size = 8;
  EXPECT_THROW(plan_layouts(request), Error);  // 405B does not fit on one node of A100
}

TEST(Planner, SearchesPipelinesThatDoNotDivideTheLayers) {
  // Llama 3 405B's 126 layers on 2048 H100s: pp 4, 8 and 16 (16 is how it was trained) do not
  // divide 126; the planner considers and simulates them, uneven stages and all.
  HardwareCatalog catalog;
  PlanRequest request;
  request.model = model_preset("llama3-405b");
  request.hardware = catalog.get("h100-sxm");
  request.devices = 2048;
  request.global_batch_size = 2048;
  request.max_micro_batch_size = 2;
  request.top = 100000;  // every fitting layout
  const PlanResult result = plan_layouts(request);
  int uneven = 0;
  for (const auto& p : result.best) {
    EXPECT_EQ(p.layout.world_size(), 2048);
    if (126 % p.layout.pp != 0) {
      ++uneven;
      EXPECT_GT(p.tokens_per_second, 0.0);
    }
  }
  EXPECT_GT(uneven, 0) << result.fitting << " fitting layouts, none with uneven stages";
}

std::string run_cli(const std::string& arguments, int* status) {
  const std::string command = std::string(LATTICE_BINARY) + " " + arguments + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string output;
  std::array<char, 4096> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe.get())) output += buffer.data();
  *status = pclose(pipe.release());
  return output;
}

TEST(Cli, VerbsPrintJsonAndRejectBadInput) {
  int status = 0;
  std::string out = run_cli(
      "estimate compute --model gpt3-175b --tokens 300e9 --gpus 1024 "
      "--tflops 140 --json",
      &status);
  ASSERT_EQ(status, 0) << out;
  nlohmann::json json = nlohmann::json::parse(out);
  EXPECT_NEAR(json["total_flops_6nd"].get<double>() / 1e23, 3.14, 0.005);
  EXPECT_NEAR(json["megatron_eq4_days"].get<double>(), 34.0, 0.5);

  out = run_cli("estimate memory --model llama3-405b --gpu h100-sxm --json", &status);
  ASSERT_EQ(status, 0) << out;
  json = nlohmann::json::parse(out);
  EXPECT_EQ(json["min_devices_for_weights"].get<int>(), 10);

  out = run_cli("simulate --model gpt2-350m --pp 2 --global-batch 4 --json", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_GT(nlohmann::json::parse(out)["mfu"].get<double>(), 0.0);

  out = run_cli("plan --model gpt2-124m --gpu h100-sxm --gpus 8 --global-batch 64 --json", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_FALSE(nlohmann::json::parse(out)["layouts"].empty());

  out = run_cli("simulate --model gpt2-124m --gpu tpu-v9", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("unknown GPU"), std::string::npos) << out;
  out = run_cli("simulate --model gpt2-124m --tp 5", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("does not divide"), std::string::npos) << out;
}

}  // namespace
}  // namespace lattice::plan
