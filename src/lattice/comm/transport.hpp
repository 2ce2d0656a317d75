// Transport: the point-to-point byte channel the collective algorithms (ring, tree,
// halving-doubling, pairwise) run over, one per communicator and backend. Messages between a pair
// of ranks arrive in the order sent; a send may block until the peer receives it (rendezvous), so
// algorithms pair sends with receives through sendrecv where both directions are live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/dtype.hpp"

namespace lattice::comm {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void send(const void* data, size_t bytes, int peer) = 0;
  virtual void recv(void* data, size_t bytes, int peer) = 0;
  // Sends to `destination` and receives from `source` at the same time.
  virtual void sendrecv(const void* send_data, size_t send_bytes, int destination, void* recv_data,
                        size_t recv_bytes, int source) = 0;

  // acc[i] = local[i] op received[i] for `count` elements received from `source` (local may be
  // acc); divides by average_divisor when it is > 0. Backends that can read the peer's buffer in
  // place override these; the defaults receive into a scratch buffer first.
  virtual void recv_reduce(void* acc, const void* local, int64_t count, DType dtype, ReduceOp op,
                           int source, int average_divisor = 0);
  virtual void sendrecv_reduce(const void* send_data, size_t send_bytes, int destination, void* acc,
                               const void* local, int64_t count, DType dtype, ReduceOp op,
                               int source, int average_divisor = 0);

 protected:
  void* scratch(size_t bytes);

 private:
  std::vector<unsigned char> scratch_;
};

}  // namespace lattice::comm
