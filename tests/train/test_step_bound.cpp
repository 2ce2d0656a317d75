// Tests of the measured MFU bound (train/step_bound.hpp): the Linear shapes it times are exactly
// the model's matrices (their FLOPs are the 6N of the MFU formula, less the biases and norms), its
// parts add up, a bound is never below the step Lattice actually runs, bf16 charges its optimizer
// the bf16 copy and times the bf16 attention kernels, and MoE models are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/step_bound.hpp"
#include "lattice/train/train_benchmark.hpp"

namespace lattice::train {
namespace {

// Parameters outside the Linear layers' weights: biases, norms and (untied) the token embedding.
double non_matrix_parameters(const model::ModelConfig& m) {
  const double d = static_cast<double>(m.d_model), L = static_cast<double>(m.n_layers);
  if (m.family ==
      model::Family::gpt2)  // 2 LayerNorms per block + ln_f; qkv, proj, fc, fc-proj biases
    return L * (4 * d + (3 * d + d + static_cast<double>(m.ffn_hidden) + d)) + 2 * d;
  // Llama: 2 RMSNorms per block + the final one; the untied head's embedding table.
  return L * 2 * d + d + static_cast<double>(m.vocab_size) * d;
}

TEST(StepBound, TimesExactlyTheModelsMatricesAndItsPartsAddUp) {
  kernels::CpuOps ops;
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    const auto m = model::model_preset(preset);
    const int64_t batch = 2, seq = 32;
    const double peak = calibrate_peak_flops(ops, kernels::Precision::fp32);
    const auto bound = measure_step_bound(m, batch, seq, kernels::Precision::fp32, ops, peak);
    double matrix_parameters = 0, gemm_seconds = 0;
    for (const auto& g : bound.gemms) {
      EXPECT_EQ(g.M, batch * seq) << g.name;
      EXPECT_GT(g.forward_seconds, 0) << g.name;
      EXPECT_GT(g.backward_seconds, 0) << g.name;
      matrix_parameters += static_cast<double>(g.count * g.K * g.N);
      gemm_seconds += static_cast<double>(g.count) * g.seconds();
    }
    // The timed matrices plus the biases, norms (and Llama's input embedding) are N of 6N.
    EXPECT_DOUBLE_EQ(matrix_parameters + non_matrix_parameters(m),
                     static_cast<double>(m.active_parameter_count(false)));
    EXPECT_DOUBLE_EQ(bound.gemm_seconds, gemm_seconds);
    EXPECT_DOUBLE_EQ(bound.seconds(),
                     bound.gemm_seconds + bound.attention_seconds + bound.optimizer_seconds);
    EXPECT_DOUBLE_EQ(bound.attention_seconds, bound.attention_flops / peak);
    EXPECT_GT(bound.optimizer_seconds, 0);
    EXPECT_GT(bound.attention_kernel_seconds, 0);  // measured, and outside seconds() (above)
    EXPECT_GT(bound.optimizer_bandwidth(), 1e8);   // any host streams faster than 100 MB/s
    EXPECT_DOUBLE_EQ(bound.optimizer_bytes, 32.0 * static_cast<double>(m.parameter_count()));
    EXPECT_DOUBLE_EQ(bound.model_flops, m.flops_per_token(seq) * static_cast<double>(batch * seq));
    EXPECT_GT(bound.mfu(), 0.0);
  }
}

TEST(StepBound, IsNeverBelowTheStepLatticeRuns) {
  // The bound leaves out everything but the GEMMs, attention at peak and the optimizer's kernels,
  // so the real step (same shapes, same engine) can only be slower. Best of 3 runs of 3 steps
  // against the bound of the same process: a shared host's load can only slow the step, and a
  // slowed bound measurement can at most halve the bound (the factor 2 below).
  const auto m = model::model_preset("gpt2-tiny");
  const BenchmarkCase c{"tiny", m, 4, 32};
  kernels::CpuOps ops;
  const double peak = calibrate_peak_flops(ops, kernels::Precision::fp32);
  const auto bound = measure_step_bound(m, c.batch, c.seq_len, kernels::Precision::fp32, ops, peak);
  double best_step = 1e300;
  for (int run = 0; run < 3; ++run) {
    const auto r = benchmark_lattice_training(c, kernels::Precision::fp32, 3, 1);
    best_step = std::min(best_step, r.seconds_per_step);
  }
  EXPECT_GE(best_step, 0.5 * bound.seconds());
}

TEST(StepBound, Bf16TimesItsOwnOptimizerAndAttentionKernels) {
  // bf16: the optimizer also writes the weights' bf16 copy (34 bytes a parameter), and the
  // attention kernels beside the bound are the bf16 ones (with GPT-2's bias column sums).
  const auto m = model::model_preset("gpt2-tiny");
  kernels::CpuOps ops;
  const double peak = calibrate_peak_flops(ops, kernels::Precision::bf16);
  const auto bound = measure_step_bound(m, 2, 32, kernels::Precision::bf16, ops, peak);
  EXPECT_DOUBLE_EQ(bound.optimizer_bytes, 34.0 * static_cast<double>(m.parameter_count()));
  EXPECT_GT(bound.optimizer_seconds, 0);
  EXPECT_GT(bound.attention_kernel_seconds, 0);
  EXPECT_DOUBLE_EQ(bound.seconds(),
                   bound.gemm_seconds + bound.attention_seconds + bound.optimizer_seconds);
}

TEST(StepBound, RefusesMixtureOfExpertsModels) {
  auto m = model::model_preset("llama-tiny");
  m.n_experts = 4;
  m.top_k = 2;
  kernels::CpuOps ops;
  EXPECT_THROW(measure_step_bound(m, 2, 16, kernels::Precision::fp32, ops, 1e9), Error);
}

}  // namespace
}  // namespace lattice::train
