// The lines a training run starts with (world rank 0 prints them): the model, precision, batch and
// threads; each parallelism the layout uses (data with its ZeRO stage and buckets, context,
// tensor, pipeline with its schedule and stages); the FLOPs per token and the peak MFU is taken
// against; in bf16, how the GEMMs run.
#pragma once

#include "lattice/kernels/ops.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/train/pipeline_rank.hpp"
#include "lattice/train/step_reporter.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

// `data_parallel`: this rank's (first stage's) data parallelism; `pipeline_rank`: null without
// pipeline parallelism.
void print_run_banner(const TrainConfig& config, mesh::Mesh& mesh, const RunRates& rates,
                      const parallel::DataParallel& data_parallel,
                      const PipelineRank* pipeline_rank, const kernels::Ops& ops);

}  // namespace lattice::train
