// Pairwise all-to-all: n-1 sendrecv steps plus the local block copy.
#include "lattice/comm/algorithms/pairwise.hpp"

#include <vector>

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {

void pairwise_all_to_all(Transport& transport, const void* in, std::span<const int64_t> send_counts,
                         void* out, std::span<const int64_t> recv_counts, DType dtype) {
  const int n = transport.size();
  const int rank = transport.rank();
  const size_t element = dtype_size(dtype);
  std::vector<size_t> send_offset(static_cast<size_t>(n) + 1, 0), recv_offset(send_offset);
  for (int r = 0; r < n; ++r) {
    send_offset[r + 1] = send_offset[r] + static_cast<size_t>(send_counts[r]) * element;
    recv_offset[r + 1] = recv_offset[r] + static_cast<size_t>(recv_counts[r]) * element;
  }
  const char* send_base = static_cast<const char*>(in);
  char* recv_base = static_cast<char*>(out);
  copy_bytes(recv_base + recv_offset[rank], send_base + send_offset[rank],
             static_cast<size_t>(send_counts[rank]) * element);
  for (int step = 1; step < n; ++step) {
    int destination = (rank + step) % n;
    int source = (rank - step + n) % n;
    transport.sendrecv(send_base + send_offset[destination],
                       send_offset[destination + 1] - send_offset[destination], destination,
                       recv_base + recv_offset[source],
                       recv_offset[source + 1] - recv_offset[source], source);
  }
}

}  // namespace lattice::comm
