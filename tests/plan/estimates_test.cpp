// Parameter counts, memory and compute estimates against published figures
// (docs/published.md) and the released model configs.
#include <gtest/gtest.h>

#include <cmath>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/replay.hpp"
#include "lattice/plan/compute_estimate.hpp"
#include "lattice/plan/hardware.hpp"
#include "lattice/plan/memory_estimate.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {
namespace {

constexpr double kGB = 1e9;

// Totals of the released checkpoints (Hugging Face model cards / safetensors metadata).
TEST(ModelSpec, ParameterCountsMatchReleasedCheckpoints) {
  EXPECT_EQ(count_parameters(model_preset("gpt2-124m")).total, 124439808);
  EXPECT_EQ(count_parameters(model_preset("gpt2-350m")).total, 354823168);
  EXPECT_EQ(count_parameters(model_preset("gpt2-774m")).total, 774030080);
  EXPECT_EQ(count_parameters(model_preset("gpt2-1.5b")).total, 1557611200);
  EXPECT_EQ(count_parameters(model_preset("llama-7b")).total, 6738415616);
  EXPECT_EQ(count_parameters(model_preset("llama-13b")).total, 13015864320);
  EXPECT_EQ(count_parameters(model_preset("llama-70b")).total, 68976648192);
  EXPECT_EQ(count_parameters(model_preset("llama3-8b")).total, 8030261248);
  EXPECT_EQ(count_parameters(model_preset("llama3-70b")).total, 70553706496);
  EXPECT_EQ(count_parameters(model_preset("llama3-405b")).total, 405853388800);
  const ParameterCount mixtral = count_parameters(model_preset("mixtral-8x7b"));
  EXPECT_EQ(mixtral.total, 46702792704);
  EXPECT_NEAR(mixtral.active / 1e9, 12.9, 0.05);  // "12.9B active parameters" (Mistral AI)
  // GPT-3 paper: 175.0B (174.6B with V = 50257, s = 2048).
  EXPECT_NEAR(count_parameters(model_preset("gpt3-175b")).total / 1e9, 174.6, 0.05);
  // Megatron Table 1 / Korthikanti Table 3 names: 1.7B, 7.5B, 39.1B, 145.6B, 1008B, 530B.
  EXPECT_NEAR(count_parameters(model_preset("megatron-7.5b")).total / 1e9, 7.5, 0.05);
  EXPECT_NEAR(count_parameters(model_preset("megatron-39.1b")).total / 1e9, 39.1, 0.05);
  EXPECT_NEAR(count_parameters(model_preset("megatron-145.6b")).total / 1e9, 145.6, 0.05);
  EXPECT_NEAR(count_parameters(model_preset("megatron-1t")).total / 1e9, 1008.0, 0.5);
  EXPECT_NEAR(count_parameters(model_preset("korthikanti-530b")).total / 1e9, 529.6, 0.1);
}

TEST(ModelSpec, RejectsInconsistentDimensions) {
  ModelSpec bad = model_preset("gpt2-124m");
  bad.n_heads = 7;
  EXPECT_THROW(count_parameters(bad), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

// ZeRO (Rajbhandari et al., SC20), Figure 1 / Table 1: Ψ = 7.5B, K = 12.
TEST(MemoryEstimate, ReproducesZeroModelStateFigures) {
  const double psi = 7.5e9;
  EXPECT_NEAR(model_state_bytes(psi, 0, 64) / kGB, 120.0, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 1, 64) / kGB, 31.4, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 2, 64) / kGB, 16.6, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 3, 64) / kGB, 1.88, 0.01);
  EXPECT_NEAR(model_state_bytes(psi, 0, 4) / kGB, 120.0, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 1, 4) / kGB, 52.5, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 2, 4) / kGB, 41.3, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 3, 4) / kGB, 30.0, 0.05);
}

// Korthikanti et al. (MLSys 2023) Table 2: bytes per layer for each configuration.
TEST(MemoryEstimate, ReproducesKorthikantiActivationFormulas) {
  const ModelSpec m = model_preset("korthikanti-175b");  // h = 12288, a = 96, s = 2048
  const double s = 2048, b = 2, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  ParallelLayout l;
  l.micro_batch_size = 2;
  l.global_batch_size = 2;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * (34 + 5 * a * s / h));
  l.tp = 8;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * (34 / t + 5 * a * s / (h * t)));
  l.sequence_parallel = false;
  l.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * (10 + 24 / t));
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * 34 / t);
  l.tp = 1;
  l.sequence_parallel = false;
  l.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), sbh * 2);
}

// DeepSeek-V3's multi-head latent attention: Q and K of 128 heads x 192 channels, V and the
// attention output of 128 x 128 (instead of d_model-wide Q, K, V), and the latent tensors kept
// whole on every tp rank: q_a's output and its norm's (1536 each), c and its norm's (512 each);
// the MoE's experts at their own width with the shared expert, the dense layers at theirs.
TEST(MemoryEstimate, LatentAttentionKeepsItsOwnWidths) {
  ModelSpec m = planning_model(model_preset("deepseek-v3"), 4096);
  ParallelLayout l;
  l.micro_batch_size = 1;
  l.global_batch_size = 1;
  l.recompute = Recompute::kSelective;
  const double s = 4096, h = 7168;
  // The MLP: 58 MoE layers of top-8 routed experts and one shared expert of width 2048 (and the
  // 8 dispatched copies), 3 dense layers of 18432: the mean over the 61.
  const double moe_layer = 6 * 2048.0 * 8 + 6 * 2048.0 + 2 * h * 8, dense_layer = 6 * 18432.0;
  const double mlp = (58 * moe_layer + 3 * dense_layer) / 61;
  const double attention = 2 * (2 * 128 * 192.0 + 2 * 128 * 128.0);
  const double latent = 2 * 2 * (1536.0 + 512.0);
  const double replicated = h * (4 + 2 + 2);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l), s * (replicated + latent + attention + mlp));
  l.tp = 8;
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, l),
                   s * (replicated / 8 + latent + (attention + mlp) / 8));
}

// Mistral 7B's sliding window of 4096: without FlashAttention each query keeps the scores of at
// most 4096 keys (2 bytes each), not of the whole 32768-token sequence.
TEST(MemoryEstimate, ASlidingWindowBoundsTheStoredScores) {
  ModelSpec windowed = planning_model(model_preset("mistral-7b"), 32768);
  ModelSpec full = windowed;
  full.sliding_window = 0;
  ParallelLayout l;
  l.micro_batch_size = 1;
  l.global_batch_size = 1;
  l.tp = 2;
  const double s = 32768, a = 32, W = 4096;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(full, l) - activation_bytes_per_layer(windowed, l),
                   a * s * (s - W) * 2 / 2);
}

// Korthikanti §4.2.3: with 1F1B the first stage holds L layers' worth of activations (p
// microbatches of L/p layers); interleaving with v chunks multiplies that by 1 + (p-1)/(p v).
TEST(MemoryEstimate, PipelineFirstStageHoldsLLayersOfActivations) {
  ModelSpec m = model_preset("korthikanti-530b");
  m.dropout = 0;  // leave out the embedding's dropout mask to compare the layer term alone
  ParallelLayout l;
  l.tp = 8;
  l.pp = 35;
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  l.global_batch_size = 280;
  const double per_layer = activation_bytes_per_layer(m, l);
  const MemoryEstimate one_f_one_b = estimate_memory(m, l);
  EXPECT_NEAR(one_f_one_b.stages[0].activation_bytes / (m.n_layers * per_layer), 1.0, 1e-12);
  EXPECT_LT(one_f_one_b.stages[34].activation_bytes, one_f_one_b.stages[0].activation_bytes);

  ModelSpec m96 = megatron_gpt("gpt-96", 96, 12288, 96);
  m96.dropout = 0;
  l.pp = 8;
  l.global_batch_size = 64;
  l.schedule = pipeline::ScheduleKind::kInterleaved;
  const double per_layer_96 = activation_bytes_per_layer(m96, l);
  for (int v : {2, 3, 4}) {
    l.virtual_stages = v;
    const MemoryEstimate interleaved = estimate_memory(m96, l);
    const double expected = m96.n_layers * per_layer_96 * (1 + (l.pp - 1.0) / (l.pp * v));
    EXPECT_NEAR(interleaved.stages[0].activation_bytes / expected, 1.0, 1e-12) << "v=" << v;
  }
  l.schedule = pipeline::ScheduleKind::kGPipe;
  l.virtual_stages = 1;
  const MemoryEstimate gpipe = estimate_memory(m96, l);
  EXPECT_NEAR(gpipe.stages[0].activation_bytes / (64 * (96 / 8) * per_layer_96), 1.0, 1e-12);
}

// The in-flight counts the memory estimate uses are those of the generated schedules, replayed.
TEST(MemoryEstimate, InFlightCountsMatchTheReplayedSchedules) {
  using pipeline::ScheduleKind;
  for (auto [kind, v] :
       {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::kOneFOneB, 1},
        std::pair{ScheduleKind::kZeroBubbleH1, 1}, std::pair{ScheduleKind::kInterleaved, 2},
        std::pair{ScheduleKind::kInterleaved, 3}, std::pair{ScheduleKind::kZeroBubbleV, 2}}) {
    for (auto [p, m] : {std::pair{4, 8}, std::pair{4, 16}, std::pair{8, 8}, std::pair{8, 24}}) {
      ParallelLayout l;
      l.pp = p;
      l.schedule = kind;
      l.virtual_stages = v;
      l.global_batch_size = m;
      const pipeline::ReplayResult r = pipeline::replay(pipeline::make_schedule(kind, p, m, v),
                                                        pipeline::uniform_costs(1, 2, 1));
      for (int rank = 0; rank < p; ++rank) {
        if (kind == ScheduleKind::kZeroBubbleV)  // the estimate is the generator's bound
          EXPECT_LE(r.peak_in_flight[rank], peak_chunks_in_flight(l, rank));
        else
          EXPECT_EQ(r.peak_in_flight[rank], peak_chunks_in_flight(l, rank))
              << pipeline::schedule_kind_name(kind) << " v=" << v << " p=" << p << " m=" << m
              << " rank " << rank;
      }
    }
  }
}

// Expert parallelism shards the experts' parameters; context parallelism the sequence's
// activations.
TEST(MemoryEstimate, ExpertAndContextParallelismShardWhatTheyShould) {
  const ModelSpec mixtral = model_preset("mixtral-8x7b");
  const ParameterCount count = count_parameters(mixtral);
  ParallelLayout l;
  l.dp = 8;
  l.global_batch_size = 8;
  const double dense_params =
      static_cast<double>(count.total - mixtral.n_layers * count.per_layer_experts);
  for (int ep : {1, 2, 8}) {
    l.ep = ep;
    const double expected = dense_params + mixtral.n_layers * count.per_layer_experts / double(ep);
    EXPECT_NEAR(estimate_memory(mixtral, l).peak().parameters / expected, 1.0, 1e-12)
        << "ep=" << ep;
  }
  EXPECT_THROW(
      [&] {
        auto bad = l;
        bad.ep = 3;
        estimate_memory(mixtral, bad);
      }(),
      Error);

  const ModelSpec llama = model_preset("llama3-8b");
  ParallelLayout cp1;
  cp1.global_batch_size = 1;
  cp1.recompute = Recompute::kSelective;
  ParallelLayout cp4 = cp1;
  cp4.cp = 4;
  EXPECT_NEAR(activation_bytes_per_layer(llama, cp1) / activation_bytes_per_layer(llama, cp4), 4.0,
              1e-12);
}

TEST(MemoryEstimate, ShardsModelStateAcrossTensorPipelineAndZero) {
  const ModelSpec m = model_preset("llama3-8b");
  ParallelLayout l;
  l.global_batch_size = 8;
  const double total = count_parameters(m).total;
  EXPECT_NEAR(estimate_memory(m, l).peak().parameter_bytes, 2 * total, 1);
  l.dp = 8;
  l.zero_stage = 3;
  const MemoryEstimate zero3 = estimate_memory(m, l);
  EXPECT_NEAR(
      zero3.peak().parameter_bytes + zero3.peak().gradient_bytes + zero3.peak().optimizer_bytes,
      16 * total / 8, 1);
  EXPECT_THROW(
      [&] {
        ParallelLayout bad = l;
        bad.tp = 3;
        estimate_memory(m, bad);
      }(),
      Error);
}

// The 405B model: 810 GB of bf16 weights; 80 GiB H100s needed for weights alone and for the full
// mixed-precision state (16 bytes per parameter), before activations.
TEST(MemoryEstimate, Llama405BOnH100) {
  const ModelSpec m = model_preset("llama3-405b");
  HardwareCatalog catalog;
  const MinimumDevices need = minimum_devices(m, catalog.get("h100-sxm"));
  EXPECT_NEAR(need.weight_bytes / kGB, 811.7, 0.1);  // "810 GB"
  EXPECT_EQ(need.for_weights, 10);                   // 811.7 GB / 85.9 GB
  EXPECT_NEAR(need.model_state_bytes / 1e12, 6.49, 0.01);
  EXPECT_EQ(need.for_model_state, 76);
}

// GPT-3 175B on 300B tokens: 3.14E+23 FLOPs (6ND; Brown et al. Table D.1) = 3.64E+03 PF-days.
TEST(ComputeEstimate, Gpt3TotalFlopsAndMegatronTrainingTime) {
  const ModelSpec m = model_preset("gpt3-175b");
  ParallelLayout l;
  l.global_batch_size = 1536;
  const ComputeEstimate e = estimate_compute(m, l, 300e9, 1024, 140e12);
  EXPECT_NEAR(e.total_flops_6nd / 1e23, 3.14, 0.005);
  EXPECT_NEAR(e.total_flops_6nd / (1e15 * 86400) / 1e3, 3.64, 0.005);
  // With attention and logits the count is about 3% higher.
  EXPECT_GT(e.total_flops, e.total_flops_6nd);
  EXPECT_LT(e.total_flops, 1.04 * e.total_flops_6nd);
  // Megatron §5.1: 1024 A100 at 140 TFLOP/s per GPU take about 34 days (eq. 4, P = 175B).
  EXPECT_NEAR(megatron_training_seconds(300e9, 175e9, 1024, 140e12) / 86400, 34.0, 0.5);
}

// The per-operation count equals Korthikanti eq. 7 and Megatron eq. 3 for GPT models.
TEST(ComputeEstimate, OperationCountEqualsPublishedClosedForms) {
  for (const char* name : {"korthikanti-22b", "korthikanti-530b", "megatron-1t", "gpt3-175b"}) {
    const ModelSpec m = model_preset(name);
    EXPECT_NEAR(model_flops_per_sequence(m) * 7 / korthikanti_model_flops(m, 7), 1.0, 1e-12)
        << name;
    EXPECT_NEAR(
        hardware_flops_per_sequence(m, Recompute::kFull) * 5 / megatron_flops_with_recompute(m, 5),
        1.0, 1e-12)
        << name;
  }
}

// Korthikanti Table 5: MFU and HFU follow from eq. 7 and 8 and the measured iteration times.
TEST(ComputeEstimate, KorthikantiTable5Utilisation) {
  const double peak = 312e12;
  const ModelSpec m22 = model_preset("korthikanti-22b");
  EXPECT_NEAR(korthikanti_model_flops(m22, 4) / (8 * 1.10 * peak), 0.415, 0.003);
  EXPECT_NEAR(korthikanti_selective_hardware_flops(m22, 4) / (8 * 1.10 * peak), 0.437, 0.003);
  const ModelSpec m530 = model_preset("korthikanti-530b");
  EXPECT_NEAR(korthikanti_model_flops(m530, 280) / (280 * 37.83 * peak), 0.560, 0.003);
  EXPECT_NEAR(korthikanti_selective_hardware_flops(m530, 280) / (280 * 37.83 * peak), 0.570, 0.003);
}

TEST(Hardware, CatalogLookupOverrideAndErrors) {
  HardwareCatalog catalog;
  EXPECT_DOUBLE_EQ(catalog.get("A100-80GB").peak_bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(catalog.get("h100-sxm").peak_bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(catalog.get("h100-pcie").peak_bf16_flops, 756e12);
  EXPECT_DOUBLE_EQ(catalog.get("b200").peak_bf16_flops, 2250e12);
  EXPECT_DOUBLE_EQ(catalog.get("mi300x").peak_bf16_flops, 1307e12);
  EXPECT_DOUBLE_EQ(catalog.get("h200").memory_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(catalog.get("a100-80gb").memory_bandwidth, 2.039e12);
  EXPECT_THROW(catalog.get("tpu-v9"), Error);
  catalog.load_toml_string(R"(
[gpu.h100-sxm]
inter_node_gbs = 100
[gpu.my-a100]
based_on = "a100-40gb"
memory_gib = 80
)");
  EXPECT_DOUBLE_EQ(catalog.get("h100-sxm").inter_node_bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(catalog.get("h100-sxm").peak_bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(catalog.get("my-a100").memory_bytes, 80.0 * (1 << 30));
  EXPECT_THROW(catalog.load_toml_string("[gpu.x]\npeak_bf16_tflops = 1\n"), Error);
  EXPECT_THROW(catalog.load_toml_string("[gpu.h100-sxm]\nwarp_speed = 9\n"), Error);
}

TEST(Hardware, CalibratesThisCpu) {
  const HardwareSpec cpu = calibrate_this_cpu();
  EXPECT_GT(cpu.peak_bf16_flops, 1e9);
  EXPECT_GT(cpu.memory_bandwidth, 1e8);
  EXPECT_GT(cpu.memory_bytes, 1e8);
}

}  // namespace
}  // namespace lattice::plan
