// MPI element types and reduction operations for Lattice's DType and ReduceOp. bf16 and fp16 have
// no MPI type, so they travel as 16-bit words and reduce with user-defined MPI_Ops (fp32
// accumulation); those ops are owned by an MpiReductionOps object, not by global state.
#pragma once

#if LATTICE_HAVE_MPI
#include <mpi.h>

#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/dtype.hpp"

namespace lattice::comm {

MPI_Datatype mpi_datatype(DType dtype);

class MpiReductionOps {
 public:
  MpiReductionOps();
  ~MpiReductionOps();
  MpiReductionOps(const MpiReductionOps&) = delete;
  MpiReductionOps& operator=(const MpiReductionOps&) = delete;
  // The MPI_Op that combines `dtype` elements by `op` (avg combines as sum; the caller divides).
  MPI_Op get(DType dtype, ReduceOp op) const;

 private:
  MPI_Op half_ops_[2][3];  // [bf16, f16][sum, max, min]
};

}  // namespace lattice::comm
#endif
