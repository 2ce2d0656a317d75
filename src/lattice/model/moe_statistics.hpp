// What one MoE layer's forward reports for the metrics and the training line: its balancing
// losses (unscaled values) and how the micro-batch's tokens spread over its experts.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::model {

struct MoeLayerStatistics {
  int64_t layer = 0;            // the global block index
  int64_t tokens = 0;           // tokens routed (this rank's rows)
  int64_t copies = 0;           // tokens x top_k
  int64_t dropped = 0;          // copies over an expert's capacity (0 when dropless)
  std::vector<int64_t> counts;  // [experts] copies routed to each expert (before drops)
  double aux_loss = 0, z_loss = 0;
  int64_t forwards = 1;  // micro-batches these are summed over (Transformer::take_moe_statistics)
};

}  // namespace lattice::model
