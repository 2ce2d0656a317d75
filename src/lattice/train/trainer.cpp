// Trainer: see trainer.hpp.
#include "lattice/train/trainer.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/metrics.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  if (config_.threads > 0) omp_set_num_threads(static_cast<int>(config_.threads));
  batches_ = std::make_unique<BatchSource>(config_);
  matmul_ = std::make_unique<kernels::MatmulEngine>();
  model_ = std::make_unique<model::Transformer>(config_.model, &tracker_);
  model_->initialize(config_.seed);
  optimizer_ =
      std::make_unique<optim::AdamWOptimizer>(model_->parameters(), config_.adamw, &tracker_);
  std::string resume_dir =
      config_.resume_from.empty() ? "" : resolve_checkpoint(config_.resume_from);
  if (resume_dir.empty() && config_.resume && config_.checkpoint_enable)
    resume_dir = latest_checkpoint(config_.run_dir);
  if (!resume_dir.empty()) {
    TrainerState state = load_checkpoint(resume_dir, *model_, optimizer_.get());
    check(state.seed == config_.seed,
          "checkpoint " + resume_dir + " was trained with training.seed = " +
              std::to_string(state.seed) + ": resume with the same seed or use a new job.run_dir");
    start_step_ = state.step;
    batches_->set_position(state.samples_consumed);
    std::printf("resumed from %s at step %lld\n", resume_dir.c_str(),
                static_cast<long long>(start_step_));
  }
}

Trainer::~Trainer() = default;

double Trainer::validation_loss() {
  const int64_t B = config_.micro_batch_size, T = config_.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  model::LayerContext ctx{*matmul_, config_.precision, &tracker_};
  double sum = 0;
  for (int64_t i = 0; i < config_.val_batches; ++i) {
    batches_->validation_batch(i, inputs.data(), targets.data(), B);
    sum += model_->evaluate(ctx, inputs.data(), targets.data(), B, T);
  }
  return sum / static_cast<double>(config_.val_batches);
}

TrainResult Trainer::run() {
  fs::create_directories(config_.run_dir);
  const std::string config_toml = config_.to_toml();
  write_text_atomic((fs::path(config_.run_dir) / "config.toml").string(), config_toml);

  const int64_t B = config_.micro_batch_size, T = config_.seq_len;
  const int64_t accumulation = config_.gradient_accumulation_steps;
  const int64_t tokens_per_step = B * T * accumulation;
  const double flops_per_token = config_.model.flops_per_token(T);
  double peak = config_.peak_tflops * 1e12;
  const char* peak_source = "from metrics.peak_tflops";
  if (peak <= 0) {
    peak = calibrate_peak_flops(*matmul_, config_.precision);
    peak_source = "measured by a 1024^3 GEMM calibration";
  }
  std::printf(
      "model %s: %lld parameters (%s), %lld layers, d_model %lld | %s | batch %lld x %lld "
      "tokens x %lld accumulation | %d threads\n",
      config_.model.name.c_str(), static_cast<long long>(config_.model.parameter_count()),
      model::family_name(config_.model.family).c_str(),
      static_cast<long long>(config_.model.n_layers), static_cast<long long>(config_.model.d_model),
      std::string(kernels::precision_name(config_.precision)).c_str(), static_cast<long long>(B),
      static_cast<long long>(T), static_cast<long long>(accumulation), omp_get_max_threads());
  std::printf("FLOPs per token %.3g (6N + 12·L·T·d); peak %.3f TFLOP/s (%s)\n", flops_per_token,
              peak / 1e12, peak_source);

  MetricsLogger logger(config_.jsonl ? (fs::path(config_.run_dir) / "metrics.jsonl").string() : "");
  model::LayerContext ctx{*matmul_, config_.precision, &tracker_};
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  const auto schedule = config_.lr_schedule();
  TrainResult result;
  result.first_step = start_step_ + 1;
  double window_seconds = 0;
  int64_t window_steps = 0;
  double total_seconds = 0;
  // tokens/s, TFLOP/s (6N + 12·L·T·d per token) and MFU for `tokens` trained in `seconds`.
  auto set_rates = [&](StepMetrics& m, double tokens, double seconds) {
    m.tokens_per_second = tokens / seconds;
    m.tflops = m.tokens_per_second * flops_per_token / 1e12;
    m.mfu = m.tflops * 1e12 / peak;
  };
  auto save = [&](int64_t step) {
    TrainerState state{step, batches_->position(), config_.seed};
    std::string dir = save_checkpoint(config_.run_dir, *model_, *optimizer_, state, config_toml,
                                      config_.keep_latest);
    logger.finish_progress();
    std::printf("checkpoint %s\n", dir.c_str());
  };

  for (int64_t step = start_step_ + 1; step <= config_.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    model_->parameters().zero_grads();
    double loss = 0;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      batches_->next(inputs.data(), targets.data(), B);
      loss += model_->forward(ctx, inputs.data(), targets.data(), B, T,
                              1.0f / static_cast<float>(accumulation));
      model_->backward(ctx);
    }
    loss /= static_cast<double>(accumulation);
    check(std::isfinite(loss), "the training loss became " + std::to_string(loss) + " at step " +
                                   std::to_string(step) +
                                   ": lower optimizer.lr or raise lr_scheduler.warmup_steps");
    const float lr = schedule.at(step);
    const double norm = optimizer_->step(lr);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
    window_seconds += seconds;
    ++window_steps;
    total_seconds += seconds;

    StepMetrics m;
    m.step = step;
    m.total_steps = config_.steps;
    m.loss = loss;
    m.grad_norm = norm;
    m.lr = lr;
    m.step_seconds = seconds;
    set_rates(m, static_cast<double>(tokens_per_step), seconds);
    m.tracked_bytes = tracker_.current_total();
    m.peak_tracked_bytes = tracker_.peak_total();
    m.rss_bytes = process_rss_bytes();
    m.parameter_bytes = tracker_.current(MemoryCategory::parameters);
    m.gradient_bytes = tracker_.current(MemoryCategory::gradients);
    m.optimizer_bytes = tracker_.current(MemoryCategory::optimizer_state);
    m.activation_bytes = tracker_.current(MemoryCategory::activations);
    const bool validate = batches_->has_validation() && config_.val_freq > 0 &&
                          (step % config_.val_freq == 0 || step == config_.steps);
    if (validate) m.val_loss = validation_loss();
    logger.record(m);
    if (step % config_.log_freq == 0 || step == result.first_step || step == config_.steps ||
        validate) {
      // The printed rate averages the steps since the last line.
      StepMetrics line = m;
      set_rates(line, static_cast<double>(tokens_per_step * window_steps), window_seconds);
      logger.log_step(line);
      window_seconds = 0;
      window_steps = 0;
    } else {
      logger.progress(step, config_.steps, seconds);
    }
    if (validate) result.final_val_loss = *m.val_loss;
    if (config_.checkpoint_enable && config_.checkpoint_interval > 0 &&
        step % config_.checkpoint_interval == 0 && step != config_.steps)
      save(step);
  }
  logger.finish_progress();
  if (config_.checkpoint_enable && config_.steps > start_step_) save(config_.steps);
  const int64_t steps_run = config_.steps - start_step_;
  if (steps_run > 0)
    result.tokens_per_second = static_cast<double>(tokens_per_step * steps_run) / total_seconds;
  return result;
}

}  // namespace lattice::train
