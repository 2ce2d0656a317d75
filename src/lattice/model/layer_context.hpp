// What every layer's forward and backward receives: the GEMM engine, the compute precision, the
// memory tracker for activations, and the tensor-parallel group (size 1 until tensor parallelism
// lands: the seam exists so layers become tensor-parallel by being handed a larger group, not by
// being rewritten).
#pragma once

#include "lattice/core/memory.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/cpu/precision.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::model {

struct TensorParallelGroup {
  comm::Communicator* comm = nullptr;  // null means size 1
  int rank = 0;
  int size = 1;
};

struct LayerContext {
  kernels::MatmulEngine& matmul;
  kernels::Precision precision = kernels::Precision::fp32;
  MemoryTracker* tracker = nullptr;
};

}  // namespace lattice::model
