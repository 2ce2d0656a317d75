// MPI datatype mapping and the user-defined bf16 / fp16 reduction ops.
#if LATTICE_HAVE_MPI
#include "lattice/comm/backends/mpi_datatypes.hpp"

#include "lattice/comm/half.hpp"
#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {
namespace {

template <DType kType, ReduceOp kOp>
void combine_half(void* in, void* inout, int* length, MPI_Datatype*) {
  reduce_pair(inout, inout, in, *length, kType, kOp);
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return 0;
    case ReduceOp::max:
      return 1;
    case ReduceOp::min:
      return 2;
  }
  return 0;
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MpiReductionOps::MpiReductionOps() {
  MPI_Op_create(&combine_half<DType::bf16, ReduceOp::sum>, 1, &half_ops_[0][0]);
  MPI_Op_create(&combine_half<DType::bf16, ReduceOp::max>, 1, &half_ops_[0][1]);
  MPI_Op_create(&combine_half<DType::bf16, ReduceOp::min>, 1, &half_ops_[0][2]);
  MPI_Op_create(&combine_half<DType::f16, ReduceOp::sum>, 1, &half_ops_[1][0]);
  MPI_Op_create(&combine_half<DType::f16, ReduceOp::max>, 1, &half_ops_[1][1]);
  MPI_Op_create(&combine_half<DType::f16, ReduceOp::min>, 1, &half_ops_[1][2]);
}

MpiReductionOps::~MpiReductionOps() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& row : half_ops_) {
    for (MPI_Op& op : row) MPI_Op_free(&op);
  }
}

MPI_Op MpiReductionOps::get(DType dtype, ReduceOp op) const {
  if (dtype == DType::bf16) return half_ops_[0][op_index(op)];
  if (dtype == DType::f16) return half_ops_[1][op_index(op)];
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace lattice::comm
#endif
