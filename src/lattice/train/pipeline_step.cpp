// The pipeline training step: see pipeline_step.hpp.
#include "lattice/train/pipeline_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::train {

StepOutcome pipeline_training_step(PipelineStep& pipeline, const model::LayerContext& ctx,
                                   const StepShape& shape, const MicroBatchSource& next_micro_batch,
                                   float lr, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  pipeline::PipelineExecutor& executor = *pipeline.executor;
  comm::Communicator& pp = *pipeline.pp;
  const int64_t B = shape.micro_batch_size, T = shape.seq_len, m = shape.accumulation;
  check(m == executor.schedule().num_microbatches,
        "the pipeline schedule runs " + std::to_string(executor.schedule().num_microbatches) +
            " microbatches per step, the step has " + std::to_string(m) +
            " (training.gradient_accumulation_steps): make them equal");
  // Every rank of the pipeline reads the same microbatches (the first stage uses the tokens, the
  // last the targets).
  std::vector<int32_t> tokens(static_cast<size_t>(m * B * T)), targets(tokens.size());
  pipeline::Microbatches batches;
  batches.B = B;
  batches.T = T;
  for (int64_t i = 0; i < m; ++i) {
    int32_t* in = tokens.data() + i * B * T;
    int32_t* out = targets.data() + i * B * T;
    next_micro_batch(in, out);
    batches.tokens.push_back(in);
    batches.targets.push_back(out);
  }
  // Zero the gradients; each stage's buckets reduce during the action that completes them.
  for (auto& [stage, dp] : pipeline.data_parallel) dp->begin_micro_batch(true, false);
  executor.before_final_backward = [&](int stage) {
    pipeline.data_parallel.at(stage)->begin_micro_batch(false, true);
  };
  const double loss_sum = executor.run_step(ctx, batches);
  executor.before_final_backward = nullptr;
  if (pipeline.tied) pipeline.tied->sum_gradients();
  // Each stage's norm covers that stage on every pipeline rank (its classes add over pp); the
  // chunks of an interleaved rank add their squares (one chunk: its norm as it is).
  double squares = 0, norm = 0;
  for (auto& [stage, dp] : pipeline.data_parallel) {
    const double n = dp->finish_gradients();
    squares += n * n;
    norm = n;
  }
  if (pipeline.data_parallel.size() > 1) norm = std::sqrt(squares);
  // The loss: the last stage's, averaged over its data-parallel replicas, sent to every rank.
  parallel::DataParallel& any = *pipeline.data_parallel.begin()->second;
  double loss = 0;
  if (pp.rank() == executor.last_stage_rank())
    loss = any.average(loss_sum / static_cast<double>(m));
  pp.broadcast(&loss, 1, DType::i64, executor.last_stage_rank());  // a double as 64 bits
  StepOutcome out;
  out.loss = loss;
  out.grad_norm = norm;
  check(std::isfinite(out.loss), "the training loss became " + std::to_string(out.loss) +
                                     " at step " + std::to_string(step) +
                                     ": lower optimizer.lr or raise lr_scheduler.warmup_steps");
  for (auto& [stage, dp] : pipeline.data_parallel) dp->update(lr, norm);
  // The measured bubble: the ranks' mean idle share of the longest rank's pipeline part, idle
  // being the waits for transfers and the time after a rank's own part ended.
  const pipeline::StepTimeline& timeline = executor.timeline();
  double mine[2] = {timeline.seconds, timeline.busy_seconds()};
  std::vector<double> all(static_cast<size_t>(2 * pp.size()));
  pp.all_gather(mine, all.data(), 2, DType::i64);
  double longest = 0, busy = 0;
  for (int r = 0; r < pp.size(); ++r) {
    longest = std::max(longest, all[static_cast<size_t>(2 * r)]);
    busy += all[static_cast<size_t>(2 * r + 1)];
  }
  busy /= static_cast<double>(pp.size());
  out.pp_bubble = longest > 0 ? std::max(0.0, 1.0 - busy / longest) : 0.0;
  out.communication.pp_wait_seconds = timeline.wait_seconds + timeline.send_wait_seconds;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& [stage, dp] : pipeline.data_parallel) {
    const parallel::DataParallelTimes times = dp->take_communication_times();
    out.communication.dp_exposed_seconds += times.exposed_seconds;
    out.communication.dp_seconds += times.total_seconds;
  }
  return out;
}

}  // namespace lattice::train
