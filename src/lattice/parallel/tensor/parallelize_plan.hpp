// A parallelize plan: which of a block's projections is column-split and which row-split over the
// tensor-parallel group, in the spirit of torchtitan's per-model plans ("attention.wq":
// ColwiseParallel, "attention.wo": RowwiseParallel, norms: SequenceParallel). The block reads it
// once, at construction, to declare its Linears' shards (LinearSplit); its components never look
// at it. Under sequence parallelism the norms and the residual stream run on the sequence layout's
// own rows, and every column-split projection's input is gathered (sequence_layout.hpp).
#pragma once

#include "lattice/parallel/tensor/linear_split.hpp"

namespace lattice::parallel {

// The projections of a transformer block, by what they do.
enum class ProjectionRole {
  attention_input,   // q, k, v (packed or apart)
  attention_output,  // the output projection
  mlp_input,         // c_fc / gate and up (a MoE layer's shared experts too)
  mlp_output,        // c_proj / down
  routed_experts,    // a MoE layer's experts and router (expert parallelism splits them instead)
};

struct ParallelizePlan {
  TensorSplit attention_input = TensorSplit::column;
  TensorSplit attention_output = TensorSplit::row;
  TensorSplit mlp_input = TensorSplit::column;
  TensorSplit mlp_output = TensorSplit::row;
  TensorSplit routed_experts = TensorSplit::none;

  TensorSplit split(ProjectionRole role) const;
  // Megatron-LM's plan (Shoeybi et al.; Korthikanti et al. for the sequence-parallel norms), which
  // every family Lattice has uses: attention heads and MLP channels split, each sub-layer's one
  // output reduction; the routed experts whole on each tensor-parallel rank.
  static ParallelizePlan megatron() { return {}; }
};

}  // namespace lattice::parallel
