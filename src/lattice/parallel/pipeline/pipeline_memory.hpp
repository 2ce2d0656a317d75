// The activation memory of one pipeline rank as its schedule runs it: each (stage, microbatch) set
// in flight holds what the stage's forward saved (model/activation_memory.hpp: the residual stream,
// the blocks' tensors, the head's on the last stage) and the buffers its transfers landed in (the
// input activations from the previous stage's rank, the output gradient from the next's); a set
// whose input half ran and whose weight half waits (zero-bubble schedules) also holds the Linears'
// output gradients (Block::pending_weight_bytes) and its input gradient. The peak is the largest
// such sum over the rank's action list — at most the schedule's peak in-flight count (replay.hpp)
// of sets, each at its own stage's size (interleaved and V ranks hold two stages' sets) — plus what
// only the running backward holds (the gradient flowing down, scratch, a block being recomputed).
// `lattice estimate memory --config` prints it per rank.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/model/activation_memory.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::pipeline {

struct PipelineActivationMemory {
  int in_flight = 0;           // sets held at the peak (forwarded, not yet freed)
  int awaiting_weight = 0;     // of them, sets whose W is still to run
  int64_t held_bytes = 0;      // what those sets hold (each counted at its own stage's size)
  int64_t per_microbatch = 0;  // one set of the rank's largest stage: saved tensors and buffers
  int64_t per_pending = 0;     // on top, while its W waits
  int64_t running = 0;         // held once, by the backward that runs
  int64_t total() const { return held_bytes + running; }
};

// For pipeline rank `rank` of `schedule`, whose virtual stages are `stages` (this rank's models,
// in stage order; declared-only models are fine), on B x T microbatches.
PipelineActivationMemory estimate_pipeline_activations(
    const Schedule& schedule, int rank, const std::vector<const model::Transformer*>& stages,
    kernels::Precision precision, int64_t B, int64_t T, const kernels::Ops& ops);

}  // namespace lattice::pipeline
