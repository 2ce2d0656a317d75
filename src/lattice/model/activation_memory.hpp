// The activation memory of one training forward and backward of a Transformer stage on this
// trainer, as a formula over the tensors its layers save (each layer states its own terms:
// Block::saved_bytes, Block::attention_output_bytes, Block::scratch_bytes, LmHead::saved_bytes),
// for a given precision, batch and activation-checkpointing mode. `lattice estimate memory
// --config` prints it beside the Korthikanti-style 16-bit estimate (which describes GPU trainers
// that keep bf16 activations); tests hold it to the MemoryTracker's measured peak.
//
// The peak is reached in the backward of the stage's last block, where everything is allocated:
//   residuals   (blocks + 1) · rows · d_model · 4    every block's input and the stage's output
//               (rows / tp of them under sequence parallelism: this rank's sequence rows)
//   blocks      what each block keeps from its forward (none for blocks full checkpointing
//               recomputes; selective: less the attention output and log-sum-exp)
//   transient   the one block being recomputed (full: its whole set; selective: its attention
//               output), alive only during its backward, and the largest buffers one block's
//               forward or backward allocates and frees (Block::transient_bytes: sequence
//               parallelism's gathered rows and partial sums)
//   head        the final norm, head input and logits (or their gradient, or the fused head's
//               per-thread weight-gradient partials)
//   backward    the gradient flowing down (rows · d_model · 4, or this rank's rows) and the
//               blocks' shared scratch
#pragma once

#include <cstdint>

#include "lattice/kernels/ops.hpp"
#include "lattice/kernels/precision.hpp"
#include "lattice/model/activation_checkpoint.hpp"

namespace lattice::model {

class Transformer;

struct ActivationMemory {
  int64_t residuals = 0, blocks = 0, transient = 0, head = 0, backward = 0;
  int64_t total() const { return residuals + blocks + transient + head + backward; }
};

// For `model`'s stage (its config, blocks and head) on B sequences of T tokens, with `model`'s
// activation checkpointing and head fusion, run on `ops` (whose plan chooses the head's path).
// Under context parallelism T is this rank's share of each sequence and `attention_transient` the
// context-parallel attention's own buffers (parallel/context/context_attention_memory.hpp), alive
// within one block's attention like the other per-block transients.
ActivationMemory estimate_activation_memory(const Transformer& model, kernels::Precision precision,
                                            int64_t B, int64_t T, const kernels::Ops& ops,
                                            int64_t attention_transient = 0);

}  // namespace lattice::model
