// How a model's blocks split over the virtual stages of a pipeline: even, as the user lists them
// (parallelism.pipeline_layers), or balanced by cost with the embedding counted on the first stage
// and the head (final norm, LM head, loss) on the last. Layer counts the stages do not divide are
// fine (Llama 3 405B: 126 layers on 16 stages).
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::pipeline {

// Stage s holds blocks [first[s], first[s + 1]); first.front() == 0, first.back() == n_layers.
struct StagePartition {
  std::vector<int64_t> first;
  int stages() const { return static_cast<int>(first.size()) - 1; }
  int64_t layers(int stage) const { return first[stage + 1] - first[stage]; }
};

// n_layers / stages each; a remainder goes one block each to the stages nearest the middle, so the
// first and last stages, which also carry the embedding and the head, keep the fewer. Throws when
// a stage would get no block.
StagePartition even_partition(int64_t n_layers, int stages);

// The user's blocks per stage: each at least 1, summing to n_layers (one error line otherwise).
StagePartition listed_partition(const std::vector<int64_t>& layers_per_stage, int64_t n_layers);

// Contiguous blocks per stage minimising the most expensive stage, where a block costs
// `block_cost`, and the first and last stages also cost `embedding_cost` and `head_cost` (e.g.
// their FLOPs or measured times); ties go to the partition with the earliest stages fuller.
StagePartition balanced_partition(int64_t n_layers, int stages, double block_cost,
                                  double embedding_cost, double head_cost);

}  // namespace lattice::pipeline
