// Training metrics: the per-step line (step, loss, grad norm, lr, tokens/s, TFLOP/s, MFU, memory,
// the communication of every family the layout has (communication_times.hpp), the pipeline
// bubble, a MoE model's routing), the JSONL record of the same (per MoE layer), a progress bar
// with ETA on terminals, and the GEMM calibration that measures the peak FLOP/s MFU is taken
// against when the config gives none.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "lattice/core/memory.hpp"
#include "lattice/io/tensorboard_events.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/train/communication_times.hpp"
#include "lattice/train/moe_metrics.hpp"

namespace lattice::train {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double step_seconds = 0, tokens_per_second = 0, tflops = 0, mfu = 0;
  int64_t tracked_bytes = 0, peak_tracked_bytes = 0, rss_bytes = 0;
  int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  int64_t peak_activation_bytes = 0;  // the activations' peak since the run started
  std::optional<double> val_loss;
  // The step's communication (on the printed line, the mean step's since the last line): only
  // the families the layout has are printed and recorded.
  CommunicationTimes communication;
  CommunicationFamilies families;
  // Pipeline parallelism: the measured bubble (the pipeline ranks' idle share of the step:
  // 1 - mean busy / longest step), shown with families.pp.
  double pp_bubble = 0;
  // Data parallelism: tokens/s against the configured single-rank rate.
  std::optional<double> scaling_efficiency;
  // A mixture-of-experts model: the step's routing and balancing losses (the line summarises
  // them, the JSONL record has every layer).
  std::optional<MoeStepMetrics> moe;
  // DiLoCo: outer steps and bytes to the other replica groups (training_step.hpp's Replica).
  std::optional<ReplicaExchange> replica;
};

// The best seconds of `run` over at least `min_runs` timed calls spread over at least
// `min_seconds` (after one untimed call), `before_each` called untimed before each timed one: a
// single short burst on a shared host can land on a moment when the other core is taken (once a
// calibration read half the rate, and an MFU above 100%).
template <class Run, class Before>
double best_seconds(Run&& run, int min_runs, double min_seconds, Before&& before_each) {
  using Clock = std::chrono::steady_clock;
  run();
  double best = std::numeric_limits<double>::infinity(), spent = 0;
  for (int i = 0; i < min_runs || spent < min_seconds; ++i) {
    before_each();
    const auto start = Clock::now();
    run();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    spent += seconds;
    best = std::min(best, seconds);
  }
  return best;
}
template <class Run>
double best_seconds(Run&& run, int min_runs, double min_seconds) {
  return best_seconds(std::forward<Run>(run), min_runs, min_seconds, [] {});
}

// The bytes read and written between the cold runs of linear_forward_flops: above the L3 that
// hosts of this project give a VM (tens of MiB measured), so that the operands come from memory.
inline constexpr int64_t kColdFlushBytes = int64_t{256} << 20;

// Model FLOP/s of a Linear's forward, out[M,N] = in[M,K] · W[N,K]^T, through `ops` at
// `precision`: the best of at least 8 runs over at least 0.2 s (best_seconds) on cache-line-aligned
// operands already in that precision (bf16: rounded before the timing; the weight laid out for the
// kernel on every call, as a Linear's is). `cold`: kColdFlushBytes read and written before each
// timed run, untimed, so that the operands come from memory as most of a training step's do.
double linear_forward_flops(int64_t M, int64_t K, int64_t N, kernels::Precision precision,
                            kernels::Ops& ops, bool cold = false);

// The measured peak: linear_forward_flops of a 1024^3 GEMM at the given precision. Where the
// backend's bf16 products run on the fp32 units (Ops::bf16_on_fp32_units), the bf16 peak is
// the fp32 GEMM's: those are the units that run them (a 1024^3 GEMM that widens its operands on
// every call reads 15-25% lower than the training step's larger products, whose MFU then read above
// 100%).
double calibrate_peak_flops(kernels::Ops& ops, kernels::Precision precision);

class MetricsLogger {
 public:
  // jsonl_path empty: no JSONL; tensorboard_directory empty: no TensorBoard event file. The
  // progress bar is drawn only when stdout is a terminal.
  explicit MetricsLogger(const std::string& jsonl_path,
                         const std::string& tensorboard_directory = "");
  void log_step(const StepMetrics& m);  // the printed line
  // The JSONL record (every step), and the same numbers as TensorBoard scalars: each number of the
  // record but the step, tagged with its JSON path ("loss", "memory/rss", "moe/max_mean_load"; the
  // per-layer MoE arrays stay in the JSONL).
  void record(const StepMetrics& m);
  void progress(int64_t step, int64_t total, double seconds_per_step);  // terminal only
  void finish_progress();

 private:
  std::ofstream jsonl_;
  std::unique_ptr<io::TensorBoardWriter> tensorboard_;
  bool terminal_ = false;
  bool bar_drawn_ = false;
};

std::string format_bytes(int64_t bytes);

}  // namespace lattice::train
