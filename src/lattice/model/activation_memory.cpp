// The activation-memory formula: see activation_memory.hpp.
#include "lattice/model/activation_memory.hpp"

#include <algorithm>

#include "lattice/model/transformer.hpp"

namespace lattice::model {

ActivationMemory estimate_activation_memory(const Transformer& model, kernels::Precision precision,
                                            int64_t B, int64_t T, const kernels::Ops& ops,
                                            int64_t attention_transient) {
  const ModelConfig& config = model.config();
  // The residual stream and its gradient hold this rank's sequence rows (all rows without
  // sequence parallelism).
  const int64_t rows = B * T, local = model.tensor_parallel().local_rows(rows), C = config.d_model;
  const ActivationCheckpoint& checkpointing = model.activation_checkpointing();
  const int64_t first = model.stage_range().first_block;
  ActivationMemory memory;
  memory.residuals = (model.block_count() + 1) * local * C * 4;
  int64_t scratch = 0, passing = attention_transient;
  for (int64_t i = 0; i < model.block_count(); ++i) {
    const Block& block = model.block(i);
    const int64_t saved = block.saved_bytes(precision, B, T);
    const int64_t attention = block.attention_output_bytes(B, T);
    if (checkpointing.recomputes_block(first + i)) {
      memory.transient = std::max(memory.transient, saved);
    } else if (checkpointing.mode == Recompute::kSelective) {
      memory.blocks += saved - attention;
      memory.transient = std::max(memory.transient, attention);
    } else {
      memory.blocks += saved;
    }
    scratch = std::max(scratch, block.scratch_bytes(precision, B, T));
    passing = std::max(passing, block.transient_bytes(precision, B, T));
  }
  // What one block allocates and frees within its forward or backward comes on top (the
  // embedding's and the head's own are smaller: one [rows, d_model] each).
  memory.transient += passing;
  if (model.has_head()) memory.head = model.head().saved_bytes(precision, rows, ops);
  memory.backward = local * C * 4 + scratch;
  return memory;
}

}  // namespace lattice::model
