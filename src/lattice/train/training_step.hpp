// One training step of one data-parallel rank, the one the trainer, `lattice bench train`,
// `lattice bench dp` and `lattice parity` all run: forward and backward over the gradient
// accumulation micro-batches (gradient buckets reduced during the last backward), the global
// gradient norm, the loss averaged over the batch ranks, clipping and AdamW on this rank's part of
// the state (parallel::DataParallel), and what the metrics line needs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/train/communication_times.hpp"

namespace lattice::train {

// This rank's micro-batches of one step.
struct StepShape {
  int64_t micro_batch_size = 1;  // B sequences per micro-batch
  int64_t seq_len = 1;           // T tokens per sequence
  int64_t accumulation = 1;      // micro-batches per step
};

// Fills this rank's next micro-batch: B x T input ids and B x T target ids (< 0: not counted).
using MicroBatchSource = std::function<void(int32_t* inputs, int32_t* targets)>;

struct StepOutcome {
  double loss = 0;       // mean training loss over the global batch (the same on every rank)
  double grad_norm = 0;  // global gradient norm before clipping (the same on every rank)
  double seconds = 0;    // wall time of the step on this rank
  // Since the last step's: data parallelism's (training_step) and the pipeline's point-to-point
  // waits (pipeline_step.hpp); the model's tp, cp and ep time where a StepRunner ran the step.
  CommunicationTimes communication;
  // Pipeline parallelism (pipeline_step.hpp): the measured bubble, the pipeline ranks' idle share
  // of the pipeline's part of the step (none without a pipeline).
  std::optional<double> pp_bubble;
  // DiLoCo (set by the trainer after the step).
  std::optional<ReplicaExchange> replica;
};

// Runs step `step` (1-based; it names the step when the loss is not finite) at learning rate lr.
// Collective over the data-parallel groups. Throws lattice::Error, before the update, when the
// loss is not finite.
StepOutcome training_step(model::Transformer& model, parallel::DataParallel& data_parallel,
                          const model::LayerContext& ctx, const StepShape& shape,
                          const MicroBatchSource& next_micro_batch, float lr, int64_t step);

}  // namespace lattice::train
