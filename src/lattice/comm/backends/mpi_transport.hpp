// MpiTransport: the algorithms' point-to-point channel over MPI non-blocking sends and receives on
// a communicator of their own, polled through the watchdog so a lost peer becomes an error.
#pragma once

#if LATTICE_HAVE_MPI
#include <mpi.h>

#include "lattice/comm/transport.hpp"
#include "lattice/comm/watchdog.hpp"

namespace lattice::comm {

class MpiTransport : public Transport {
 public:
  MpiTransport(MPI_Comm comm, Watchdog& watchdog);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(const void* data, size_t bytes, int peer) override;
  void recv(void* data, size_t bytes, int peer) override;
  void sendrecv(const void* send_data, size_t send_bytes, int destination, void* recv_data,
                size_t recv_bytes, int source) override;

 private:
  void complete(MPI_Request* requests, int count, int recv_index, size_t expected_bytes,
                int source);

  MPI_Comm comm_;
  Watchdog& watchdog_;
  int rank_ = 0;
  int size_ = 1;
};

// Throws Error("<what>: <MPI error string>") unless code is MPI_SUCCESS.
void check_mpi(int code, const char* what);
// Waits for `request` through the watchdog (MPI_Test polling).
void wait_mpi(MPI_Request* request, Watchdog& watchdog, const char* what = nullptr);

}  // namespace lattice::comm
#endif
