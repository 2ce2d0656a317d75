// StepReporter: what world rank 0 reports of each training step — the JSONL / TensorBoard record
// of every step, and every metrics.log_freq steps (and at the first and the last step and at a
// validation) the printed line, whose rates, communication times and pipeline bubble are the mean
// of the steps since the last line; on a terminal, a progress bar between the lines. RunRates are
// the yardsticks of the rates: the global batch, the model FLOPs per token and the peak.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lattice/core/memory.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/mesh/mesh_shape.hpp"
#include "lattice/train/communication_times.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/moe_metrics.hpp"
#include "lattice/train/train_config.hpp"
#include "lattice/train/training_step.hpp"

namespace lattice::train {

struct RunRates {
  int64_t tokens_per_step = 0;  // the global batch: B x T x accumulation x dp
  double flops_per_token = 0;   // model FLOPs (6N + 12·L·T·d)
  double peak_flops = 0;        // the run's peak, MFU's denominator (0: none)
  std::string peak_source;      // where the peak came from, for the banner
};

// The rates of `config` on `shape`'s ranks: the peak is metrics.peak_tflops or, when that is not
// set and `measure` (the printing rank), a 1024^3 GEMM's rate on `ops` times the world's ranks
// (each rank has the same kernel threads).
RunRates run_rates(const TrainConfig& config, const mesh::MeshShape& shape, kernels::Ops& ops,
                   bool measure);

class StepReporter {
 public:
  // `printing`: this rank reports (world rank 0); elsewhere report() does nothing. The tracker's
  // memory goes into every record.
  StepReporter(const TrainConfig& config, const mesh::MeshShape& shape, RunRates rates,
               int64_t first_step, const MemoryTracker& tracker, bool printing);
  // Step `step` ran at `lr` with `outcome`; `val_loss` when it validated (a line is printed then),
  // `moe` for a mixture-of-experts model.
  void report(int64_t step, float lr, const StepOutcome& outcome, std::optional<double> val_loss,
              const std::optional<MoeStepMetrics>& moe);
  // Clears the progress bar (before other output).
  void finish_progress() { logger_.finish_progress(); }

 private:
  // Tokens/s, TFLOP/s, MFU and the DP efficiency of `steps` steps over `seconds`.
  void set_rates(StepMetrics& m, int64_t steps, double seconds) const;

  const TrainConfig& config_;
  const RunRates rates_;
  const CommunicationFamilies families_;
  const int64_t first_step_;
  const MemoryTracker& tracker_;
  const bool printing_;
  MetricsLogger logger_;
  // The steps since the last printed line.
  int64_t window_steps_ = 0;
  double window_seconds_ = 0, window_bubble_ = 0;
  CommunicationTimes window_communication_;
};

}  // namespace lattice::train
