// What every layer's forward and backward receives: the kernel backend (kernels/ops.hpp: every op a
// layer computes goes through it), the compute precision, the memory tracker for activations and
// optional hooks around each parameter unit (data parallelism and ZeRO-3); under context
// parallelism, the attention that spans the ranks holding the rest of each sequence; for MoE
// layers, the group the load-balancing loss spans.
#pragma once

#include <cstdint>

#include "lattice/core/memory.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/kernels/precision.hpp"
#include "lattice/parallel/tensor/tensor_parallel_group.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::model {

class ContextAttention;

// The tensor-parallel group a stage is built with (parallel/tensor/tensor_parallel_group.hpp).
using parallel::TensorParallelGroup;

// Called by the Transformer around the forward and backward of each parameter unit (see
// Transformer::units(): the embedding, each block, the head), in execution order. Data parallelism
// starts a gradient bucket's reduction from after_backward; ZeRO-3 gathers a unit's parameters in
// before_forward / before_backward and frees them afterwards.
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  virtual void before_forward(int unit) {}
  virtual void after_forward(int unit) {}
  virtual void before_backward(int unit) {}
  virtual void after_backward(int unit) {}
};

struct LayerContext {
  kernels::Ops& ops;
  kernels::Precision precision = kernels::Precision::fp32;
  MemoryTracker* tracker = nullptr;
  ModelHooks* hooks = nullptr;  // null: no hooks
  // Context parallelism (context_parallel.hpp): the rows are this rank's share of each sequence
  // and attention reaches the other ranks' keys through it. Null: each sequence's rows are all
  // here, at positions 0 .. T - 1.
  ContextAttention* context = nullptr;
  // MoE layers: the ranks whose micro-batches one load-balancing loss spans (the batch group
  // dp x cp, whose ranks train one micro-batch together): the experts' loads are summed over it,
  // so that the loss is the one a single rank computes on the whole micro-batch. Null: this
  // rank's tokens alone.
  comm::Communicator* balancing = nullptr;
};

}  // namespace lattice::model
