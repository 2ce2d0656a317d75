// PipelineRank: what one rank of a pipeline-parallel run holds and does — its virtual stages
// (one model::Transformer each, blocks from the stage partition, under this rank's tensor-parallel
// group), each stage's data parallelism (parallel::DataParallel over the rank's batch group), the
// executor running the schedule's action list (generated from [parallelism] or read from
// parallelism.pipeline_schedule_file), and the tied embedding across the first and last stage.
// It trains a step (pipeline_step.hpp), evaluates, gathers the whole model's values for parity
// checks and loads its stages from a checkpoint of any layout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lattice/mesh/mesh.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/parallel/pipeline/executor.hpp"
#include "lattice/parallel/pipeline/stage_partition.hpp"
#include "lattice/parallel/pipeline/tied_embedding.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/pipeline_step.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

// The schedule a config runs: parallelism.pipeline_schedule_file when set (checked against pp,
// the microbatches and the virtual stages), else the generated one.
pipeline::Schedule pipeline_schedule_of(const TrainConfig& config);
// The blocks of each virtual stage: parallelism.pipeline_layers, or pipeline_partition's split.
pipeline::StagePartition pipeline_partition_of(const TrainConfig& config);

class PipelineRank {
 public:
  PipelineRank(const TrainConfig& config, mesh::Mesh& mesh, kernels::Ops& ops,
               MemoryTracker* tracker, const model::TensorParallelGroup& tp,
               const parallel::DataParallelSettings& settings,
               const model::ExpertParallelGroup& ep = {});
  ~PipelineRank();

  int stage_count() const { return static_cast<int>(models_.size()); }
  model::Transformer& model(int i) { return *models_.at(static_cast<size_t>(i)); }
  parallel::DataParallel& data_parallel(int i) { return *dps_.at(static_cast<size_t>(i)); }
  const pipeline::Schedule& schedule() const { return executor_->schedule(); }
  const pipeline::StagePartition& partition() const { return partition_; }
  const pipeline::PipelineExecutor& executor() const { return *executor_; }
  // The virtual stage of this rank's i-th model.
  int virtual_stage(int i) const { return stage_ids_.at(static_cast<size_t>(i)); }

  StepOutcome step(const model::LayerContext& ctx, const StepShape& shape,
                   const MicroBatchSource& next_micro_batch, float lr, int64_t step);
  // The mean loss of one [B, T] batch through every stage, on every pipeline rank. Collective.
  double evaluate(const model::LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                  int64_t B, int64_t T);
  // Completes pending ZeRO gathers on every stage.
  void settle_parameters();

  // The whole model's values, laid out as a one-rank model's flat store, on the rank at pipeline,
  // data-parallel and tensor-parallel coordinate 0 (`lattice parity`); other ranks return an empty
  // buffer. Collective over every rank of the run.
  std::vector<float> gather_whole();
  int64_t optimizer_steps() const { return dps_.front()->steps_taken(); }
  // Loads each stage's parameters (and AdamW state) from a checkpoint of any layout; returns its
  // state.
  TrainerState load(const std::string& checkpoint_dir);

 private:
  const TrainConfig& config_;
  mesh::Mesh& mesh_;
  kernels::Ops& ops_;
  pipeline::StagePartition partition_;
  std::vector<int> stage_ids_;  // this rank's virtual stages, ascending
  std::vector<std::unique_ptr<model::Transformer>> models_;
  std::vector<std::unique_ptr<parallel::DataParallel>> dps_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<pipeline::TiedEmbedding> tied_;
  PipelineStep step_;
};

}  // namespace lattice::train
