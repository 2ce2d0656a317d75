// The step reporter: see step_reporter.hpp.
#include "lattice/train/step_reporter.hpp"

#include <filesystem>

namespace lattice::train {

namespace fs = std::filesystem;

RunRates run_rates(const TrainConfig& config, const mesh::MeshShape& shape, kernels::Ops& ops,
                   bool measure) {
  RunRates r;
  // Each dp rank reads B sequences of T tokens per micro-batch (split over its cp ranks).
  r.tokens_per_step = config.training.micro_batch_size * config.training.seq_len *
                      config.training.gradient_accumulation_steps * shape.dp;
  r.flops_per_token = config.model.flops_per_token(config.training.seq_len);
  r.peak_flops = config.metrics.peak_tflops * 1e12;
  r.peak_source = "from metrics.peak_tflops";
  if (r.peak_flops <= 0 && measure) {
    const int world = shape.world();
    r.peak_flops = calibrate_peak_flops(ops, config.training.precision) * world;
    r.peak_source = world > 1 ? "measured by a 1024^3 GEMM calibration, x ranks"
                              : "measured by a 1024^3 GEMM calibration";
  }
  return r;
}

StepReporter::StepReporter(const TrainConfig& config, const mesh::MeshShape& shape, RunRates rates,
                           int64_t first_step, const MemoryTracker& tracker, bool printing)
    : config_(config),
      rates_(std::move(rates)),
      families_(CommunicationFamilies::of(shape)),
      first_step_(first_step),
      tracker_(tracker),
      printing_(printing),
      logger_(printing && config.metrics.jsonl
                  ? (fs::path(config.job.run_dir) / "metrics.jsonl").string()
                  : "",
              printing && config.metrics.tensorboard ? config.job.run_dir : "") {}

void StepReporter::set_rates(StepMetrics& m, int64_t steps, double seconds) const {
  m.tokens_per_second = static_cast<double>(rates_.tokens_per_step * steps) / seconds;
  m.tflops = m.tokens_per_second * rates_.flops_per_token / 1e12;
  m.mfu = rates_.peak_flops > 0 ? m.tflops * 1e12 / rates_.peak_flops : 0;
  if (families_.dp && config_.parallelism.baseline_tokens_per_second > 0)
    m.scaling_efficiency = m.tokens_per_second / config_.parallelism.baseline_tokens_per_second;
}

void StepReporter::report(int64_t step, float lr, const StepOutcome& outcome,
                          std::optional<double> val_loss,
                          const std::optional<MoeStepMetrics>& moe) {
  if (!printing_) return;
  ++window_steps_;
  window_seconds_ += outcome.seconds;
  window_communication_ += outcome.communication;
  window_bubble_ += outcome.pp_bubble.value_or(0.0);

  StepMetrics m;
  m.val_loss = val_loss;
  m.step = step;
  m.total_steps = config_.training.steps;
  m.loss = outcome.loss;
  m.grad_norm = outcome.grad_norm;
  m.lr = lr;
  m.step_seconds = outcome.seconds;
  set_rates(m, 1, outcome.seconds);
  m.tracked_bytes = tracker_.current_total();
  m.peak_tracked_bytes = tracker_.peak_total();
  m.rss_bytes = process_rss_bytes();
  m.parameter_bytes = tracker_.current(MemoryCategory::parameters);
  m.gradient_bytes = tracker_.current(MemoryCategory::gradients);
  m.optimizer_bytes = tracker_.current(MemoryCategory::optimizer_state);
  m.activation_bytes = tracker_.current(MemoryCategory::activations);
  m.peak_activation_bytes = tracker_.peak(MemoryCategory::activations);
  m.communication = outcome.communication;
  m.families = families_;
  m.pp_bubble = outcome.pp_bubble.value_or(0.0);
  m.moe = moe;
  m.replica = outcome.replica;
  logger_.record(m);
  if (step % config_.metrics.log_freq != 0 && step != first_step_ &&
      step != config_.training.steps && !val_loss) {
    logger_.progress(step, config_.training.steps, outcome.seconds);
    return;
  }
  // The printed rates and communication times average the steps since the last line.
  StepMetrics line = m;
  set_rates(line, window_steps_, window_seconds_);
  line.communication = window_communication_.mean(window_steps_);
  line.pp_bubble = window_bubble_ / static_cast<double>(window_steps_);
  logger_.log_step(line);
  window_steps_ = 0;
  window_seconds_ = window_bubble_ = 0;
  window_communication_ = {};
}

}  // namespace lattice::train
