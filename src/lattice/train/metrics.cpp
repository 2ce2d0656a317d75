// Training metrics: see metrics.hpp.
#include "lattice/train/metrics.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/error.hpp"

namespace lattice::train {
namespace {

// The numbers of a JSONL record as TensorBoard scalars, tagged by their path ("memory/rss"); the
// step is the event's own and arrays (per-layer MoE records) stay in the JSONL.
void add_scalars(const nlohmann::json& j, const std::string& prefix,
                 std::vector<std::pair<std::string, double>>& out) {
  for (const auto& [key, value] : j.items()) {
    const std::string tag = prefix.empty() ? key : prefix + "/" + key;
    if (value.is_object())
      add_scalars(value, tag, out);
    else if (value.is_number() && tag != "step")
      out.emplace_back(tag, value.get<double>());
  }
}

}  // namespace

double linear_forward_flops(int64_t M, int64_t K, int64_t N, kernels::Precision precision,
                            kernels::Ops& ops, bool cold) {
  // Cache-line-aligned operands, as the step's tensors are (aligned_allocation.hpp): from glibc's
  // 16-byte-aligned blocks the AMX product's tile stores straddle lines and its bf16 rate read
  // about 20% lower.
  const auto elements = [](int64_t rows, int64_t cols) { return static_cast<size_t>(rows * cols); };
  AlignedVector<float> in(elements(M, K)), weight(elements(N, K)), out(elements(M, N));
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
  for (size_t i = 0; i < weight.size(); ++i)
    weight[i] = 0.001f * static_cast<float>(i % 89) - 0.04f;
  // bf16 on bf16 operands, as fp32 runs on fp32 ones (rounding them inside the timing read the
  // 1024^3 rate 15% lower). Where bf16 products run on the fp32 units the engine widens them.
  const bool bf16 = precision == kernels::Precision::bf16 && !ops.bf16_on_fp32_units();
  AlignedVector<lattice::bf16> in16, weight16;
  kernels::Bf16Operands rounded;
  if (bf16) {
    in16.resize(in.size()), weight16.resize(weight.size());
    ops.convert_to_bf16(in16.data(), in.data(), static_cast<int64_t>(in.size()));
    ops.convert_to_bf16(weight16.data(), weight.data(), static_cast<int64_t>(weight.size()));
    rounded.in = in16.data(), rounded.weight = weight16.data();
  }
  AlignedVector<int32_t> flush(cold ? static_cast<size_t>(kColdFlushBytes / 4) : 0);
  const double seconds = best_seconds(
      [&] {
        ops.linear_forward(out.data(), bf16 ? nullptr : in.data(), weight.data(), nullptr, M, K, N,
                           precision, rounded);
      },
      8, 0.2,
      [&] {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < flush.size(); i += 16) flush[i] += 1;
      });
  return 2.0 * static_cast<double>(M * K) * static_cast<double>(N) / seconds;
}

double calibrate_peak_flops(kernels::Ops& ops, kernels::Precision precision) {
  if (precision == kernels::Precision::bf16 && ops.bf16_on_fp32_units())
    precision = kernels::Precision::fp32;
  return linear_forward_flops(1024, 1024, 1024, precision, ops);
}

std::string format_bytes(int64_t bytes) {
  char buffer[32];
  double v = static_cast<double>(bytes);
  if (v >= 1e9)
    std::snprintf(buffer, sizeof buffer, "%.2fGB", v / 1e9);
  else
    std::snprintf(buffer, sizeof buffer, "%.1fMB", v / 1e6);
  return buffer;
}

MetricsLogger::MetricsLogger(const std::string& jsonl_path,
                             const std::string& tensorboard_directory)
    : terminal_(isatty(STDOUT_FILENO)) {
  if (!tensorboard_directory.empty())
    tensorboard_ = std::make_unique<io::TensorBoardWriter>(tensorboard_directory);
  if (!jsonl_path.empty()) {
    jsonl_.open(jsonl_path, std::ios::app);
    check(jsonl_.good(), "cannot write metrics file " + jsonl_path + ": check the run directory");
  }
}

void MetricsLogger::log_step(const StepMetrics& m) {
  finish_progress();
  std::printf(
      "step %6lld/%lld | loss %.4f | grad_norm %.3f | lr %.3e | %.0f tok/s | %.3f TFLOP/s | MFU "
      "%.1f%% | mem %s (peak %s) rss %s",
      static_cast<long long>(m.step), static_cast<long long>(m.total_steps), m.loss, m.grad_norm,
      m.lr, m.tokens_per_second, m.tflops, 100.0 * m.mfu, format_bytes(m.tracked_bytes).c_str(),
      format_bytes(m.peak_tracked_bytes).c_str(), format_bytes(m.rss_bytes).c_str());
  const CommunicationTimes& c = m.communication;
  if (m.families.dp)
    std::printf(" | comm %.1f ms exposed of %.1f ms", 1e3 * c.dp_exposed_seconds,
                1e3 * c.dp_seconds);
  if (m.families.tp) std::printf(" | tp comm %.1f ms", 1e3 * c.tp_seconds);
  if (m.families.cp) std::printf(" | cp comm %.1f ms exposed", 1e3 * c.cp_seconds);
  if (m.families.ep) std::printf(" | ep comm %.1f ms", 1e3 * c.ep_seconds);
  if (m.families.pp)
    std::printf(" | bubble %.1f%% | p2p wait %.1f ms", 100.0 * m.pp_bubble,
                1e3 * c.pp_wait_seconds);
  if (m.scaling_efficiency) std::printf(" | DP efficiency %.1f%%", 100.0 * *m.scaling_efficiency);
  if (m.moe) {
    std::printf(" | moe load %.2f max/mean", m.moe->max_mean_load);
    if (m.moe->aux_loss > 0) std::printf(" aux %.4f", m.moe->aux_loss);
    if (m.moe->z_loss > 0) std::printf(" z %.4f", m.moe->z_loss);
    if (m.moe->dropped_fraction > 0)
      std::printf(" dropped %.2f%%", 100.0 * m.moe->dropped_fraction);
  }
  if (m.replica)
    std::printf(" | outer %lld, %s sent", static_cast<long long>(m.replica->outer_steps),
                format_bytes(m.replica->bytes_sent).c_str());
  if (m.replica && m.replica->peak_round_bytes > 0)
    std::printf(" (this round %s, peak %.3g Gbit/s)", format_bytes(m.replica->round_bytes).c_str(),
                m.replica->peak_gbps);
  if (m.val_loss) std::printf(" | val_loss %.4f", *m.val_loss);
  std::printf("\n");
  std::fflush(stdout);
}

void MetricsLogger::record(const StepMetrics& m) {
  if (!jsonl_.is_open() && !tensorboard_) return;
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"step_seconds", m.step_seconds},
                      {"tokens_per_second", m.tokens_per_second},
                      {"tflops", m.tflops},
                      {"mfu", m.mfu},
                      {"memory",
                       {{"parameters", m.parameter_bytes},
                        {"gradients", m.gradient_bytes},
                        {"optimizer_state", m.optimizer_bytes},
                        {"activations", m.activation_bytes},
                        {"peak_activations", m.peak_activation_bytes},
                        {"tracked", m.tracked_bytes},
                        {"peak_tracked", m.peak_tracked_bytes},
                        {"rss", m.rss_bytes}}}};
  const CommunicationTimes& c = m.communication;
  if (m.families.dp) {
    j["exposed_comm_seconds"] = c.dp_exposed_seconds;
    j["comm_seconds"] = c.dp_seconds;
  }
  if (m.families.tp) j["tp_comm_seconds"] = c.tp_seconds;
  if (m.families.cp) j["cp_comm_seconds"] = c.cp_seconds;
  if (m.families.ep) j["ep_comm_seconds"] = c.ep_seconds;
  if (m.families.pp) {
    j["pp_bubble"] = m.pp_bubble;
    j["pp_wait_seconds"] = c.pp_wait_seconds;
  }
  if (m.scaling_efficiency) j["scaling_efficiency"] = *m.scaling_efficiency;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.replica)
    j["diloco"] = {{"outer_steps", m.replica->outer_steps},
                   {"bytes_sent", m.replica->bytes_sent},
                   {"step_bytes", m.replica->step_bytes},
                   {"outer_seconds", m.replica->outer_seconds}};
  if (m.replica && m.replica->peak_round_bytes > 0) {
    nlohmann::json& d = j["diloco"];
    d["round_bytes"] = m.replica->round_bytes;
    d["peak_round_bytes"] = m.replica->peak_round_bytes;
    d["peak_gbps"] = m.replica->peak_gbps;
  }
  if (m.replica && !m.replica->members.empty()) {
    nlohmann::json& d = j["diloco"];
    d["members"] = m.replica->members;
    d["contributors"] = m.replica->contributors;
    d["completed"] = m.replica->completed;
    d["completed_block"] = m.replica->completed_block;
    d["next_block"] = m.replica->next_block;
    d["joined"] = m.replica->joined;
    d["weights_hash"] = std::to_string(m.replica->weights_hash);
  }
  if (m.moe) {
    nlohmann::json layers = nlohmann::json::array();
    for (const MoeLayerMetrics& l : m.moe->layers)
      layers.push_back({{"layer", l.layer},
                        {"tokens_per_expert", l.tokens_per_expert},
                        {"max_mean_load", l.max_mean_load},
                        {"dropped_fraction", l.dropped_fraction},
                        {"aux_loss", l.aux_loss},
                        {"z_loss", l.z_loss}});
    j["moe"] = {{"aux_loss", m.moe->aux_loss},
                {"z_loss", m.moe->z_loss},
                {"max_mean_load", m.moe->max_mean_load},
                {"dropped_fraction", m.moe->dropped_fraction},
                {"layers", layers}};
  }
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars;
    add_scalars(j, "", scalars);
    tensorboard_->add_scalars(m.step, scalars);
  }
  if (!jsonl_.is_open()) return;
  jsonl_ << j.dump() << "\n";
  jsonl_.flush();
}

void MetricsLogger::progress(int64_t step, int64_t total, double seconds_per_step) {
  if (!terminal_) return;
  const int width = 30;
  int filled = total > 0 ? static_cast<int>(width * step / total) : width;
  double eta = seconds_per_step * static_cast<double>(total - step);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::printf("\r[%s] %lld/%lld ETA %dm%02ds", bar.c_str(), static_cast<long long>(step),
              static_cast<long long>(total), static_cast<int>(eta) / 60,
              static_cast<int>(eta) % 60);
  std::fflush(stdout);
  bar_drawn_ = true;
}

void MetricsLogger::finish_progress() {
  if (bar_drawn_) std::printf("\r%60s\r", "");
  bar_drawn_ = false;
}

}  // namespace lattice::train
