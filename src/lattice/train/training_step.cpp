// The training step: see training_step.hpp.
#include "lattice/train/training_step.hpp"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::train {

StepOutcome training_step(model::Transformer& model, parallel::DataParallel& data_parallel,
                          const model::LayerContext& ctx, const StepShape& shape,
                          const MicroBatchSource& next_micro_batch, float lr, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t B = shape.micro_batch_size, T = shape.seq_len, accumulation = shape.accumulation;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  StepOutcome out;
  double loss = 0;
  for (int64_t micro = 0; micro < accumulation; ++micro) {
    data_parallel.begin_micro_batch(micro == 0, micro == accumulation - 1);
    next_micro_batch(inputs.data(), targets.data());
    loss += model.forward(ctx, inputs.data(), targets.data(), B, T,
                          1.0f / static_cast<float>(accumulation));
    model.backward(ctx);
  }
  out.grad_norm = data_parallel.finish_gradients();
  out.loss = data_parallel.average(loss / static_cast<double>(accumulation));
  check(std::isfinite(out.loss), "the training loss became " + std::to_string(out.loss) +
                                     " at step " + std::to_string(step) +
                                     ": lower optimizer.lr or raise lr_scheduler.warmup_steps");
  data_parallel.update(lr, out.grad_norm);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const parallel::DataParallelTimes times = data_parallel.take_communication_times();
  out.communication.dp_exposed_seconds = times.exposed_seconds;
  out.communication.dp_seconds = times.total_seconds;
  return out;
}

}  // namespace lattice::train
