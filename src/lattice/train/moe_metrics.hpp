// The MoE layers' routing over one training step for the training line and the JSONL record:
// each layer's tokens per expert, its max/mean load and dropped share, and the balancing losses,
// summed over every rank that holds the layer (data-parallel replicas and pipeline stages) so
// that every rank sees the whole step.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/model/model_config.hpp"
#include "lattice/model/moe_statistics.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::train {

struct MoeLayerMetrics {
  int64_t layer = 0;
  std::vector<int64_t> tokens_per_expert;  // copies routed to each expert over the step
  double max_mean_load = 0;                // the busiest expert's copies over the mean
  double dropped_fraction = 0;             // copies over capacity / copies
  double aux_loss = 0, z_loss = 0;         // per micro-batch, averaged
};

struct MoeStepMetrics {
  std::vector<MoeLayerMetrics> layers;  // every MoE layer of the model, in layer order
  // Over the layers: the mean balancing losses, the worst max/mean load, the dropped share.
  double aux_loss = 0, z_loss = 0, max_mean_load = 0, dropped_fraction = 0;
};

// Collective over `world`: sums each rank's statistics (Transformer::take_moe_statistics) of
// the model's MoE layers. `replicas` is how many ranks of `world` hold the same micro-batches of
// a layer besides data parallelism (the tensor-parallel ranks), whose sums it divides out.
MoeStepMetrics reduce_moe_metrics(const std::vector<model::MoeLayerStatistics>& local,
                                  const model::ModelConfig& config, comm::Communicator& world,
                                  int replicas);

}  // namespace lattice::train
