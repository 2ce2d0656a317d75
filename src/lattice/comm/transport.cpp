// Transport: the scratch-buffer forms of the reducing receives.
#include "lattice/comm/transport.hpp"

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {

void* Transport::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void Transport::recv_reduce(void* acc, const void* local, int64_t count, DType dtype, ReduceOp op,
                            int source, int average_divisor) {
  size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  void* received = scratch(bytes);
  recv(received, bytes, source);
  reduce_pair(acc, local, received, count, dtype, op, average_divisor);
}

void Transport::sendrecv_reduce(const void* send_data, size_t send_bytes, int destination,
                                void* acc, const void* local, int64_t count, DType dtype,
                                ReduceOp op, int source, int average_divisor) {
  size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  void* received = scratch(bytes);
  sendrecv(send_data, send_bytes, destination, received, bytes, source);
  reduce_pair(acc, local, received, count, dtype, op, average_divisor);
}

}  // namespace lattice::comm
