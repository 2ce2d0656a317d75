// MpiCommunicator: one MPI process-rank. Collectives run either MPI's own (native, the default) or
// Lattice's algorithms over MpiTransport; before each collective the ranks agree on what they are
// calling (one small polled allreduce), so missing ranks and mismatched calls are reported, not
// hung.
#pragma once

#if LATTICE_HAVE_MPI
#include <mpi.h>

#include <memory>

#include "lattice/comm/backends/mpi_datatypes.hpp"
#include "lattice/comm/backends/mpi_status_board.hpp"
#include "lattice/comm/backends/mpi_transport.hpp"
#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (collective over it).
  MpiCommunicator(MPI_Comm comm, CommOptions options, bool thread_multiple);
  ~MpiCommunicator() override;
  std::string_view backend() const override { return "mpi"; }

 protected:
  MpiCommunicator(MPI_Comm comm, CommOptions options, bool thread_multiple,
                  std::shared_ptr<MpiStatusBoard> board);
  Transport& transport() override { return *transport_; }
  bool has_native() const override { return true; }
  bool prefers_native() const override { return true; }
  bool supports_async_thread() const override { return thread_multiple_; }
  void run_native(const CollectiveCall& call) override;
  void before_collective(const CollectiveCall& call) override;
  std::unique_ptr<Communicator> make_split(std::span<const int> members, int new_rank,
                                           int color) override;
  void point_send(const void* data, size_t bytes, int peer, int tag) override;
  void point_recv(void* data, size_t bytes, int peer, int tag) override;
  CommHandle point_isend(const void* data, size_t bytes, int peer, int tag) override;
  CommHandle point_irecv(void* data, size_t bytes, int peer, int tag) override;

 private:
  void verify_agreement(const CollectiveDescriptor& descriptor);

  MPI_Comm comm_ = MPI_COMM_NULL;            // native collectives and verification
  MPI_Comm algorithm_comm_ = MPI_COMM_NULL;  // Lattice's algorithms
  MPI_Comm user_comm_ = MPI_COMM_NULL;       // tagged user messages
  bool thread_multiple_ = false;
  std::shared_ptr<MpiStatusBoard> board_;
  std::unique_ptr<MpiTransport> transport_;
  MpiReductionOps reduction_ops_;
};

}  // namespace lattice::comm
#endif
