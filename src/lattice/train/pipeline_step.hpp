// One training step of one pipeline rank: the schedule's microbatches through this rank's
// virtual stages (pipeline::PipelineExecutor), each stage's data-parallel gradient buckets reduced
// during the action that completes its gradients (its last B, or W), the tied embedding's two
// gradients summed across the first and last stage, the global gradient norm over every stage
// (each parameter once), the loss from the last stage on every rank, clipping and AdamW on each
// stage — the pipeline's form of training_step.hpp, with the same outcome.
#pragma once

#include <map>

#include "lattice/comm/communicator.hpp"
#include "lattice/parallel/pipeline/executor.hpp"
#include "lattice/parallel/pipeline/tied_embedding.hpp"
#include "lattice/train/training_step.hpp"

namespace lattice::train {

struct PipelineStep {
  pipeline::PipelineExecutor* executor = nullptr;
  // The data parallelism of each virtual stage this rank holds, by virtual stage.
  std::map<int, parallel::DataParallel*> data_parallel;
  pipeline::TiedEmbedding* tied = nullptr;  // null: untied
  comm::Communicator* pp = nullptr;
};

// Runs step `step` at learning rate lr; `shape.accumulation` is the schedule's microbatch count.
// Collective over the pipeline and data-parallel groups. Throws lattice::Error on every rank,
// before the update, when the loss is not finite.
StepOutcome pipeline_training_step(PipelineStep& pipeline, const model::LayerContext& ctx,
                                   const StepShape& shape, const MicroBatchSource& next_micro_batch,
                                   float lr, int64_t step);

}  // namespace lattice::train
