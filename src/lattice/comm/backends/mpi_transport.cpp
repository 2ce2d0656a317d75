// MpiTransport: MPI_Isend / MPI_Irecv with MPI_Testall polling; received sizes are checked.
#if LATTICE_HAVE_MPI
#include "lattice/comm/backends/mpi_transport.hpp"

#include <climits>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

constexpr int kAlgorithmTag = 17;

int checked_bytes(size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    throw Error("comm (mpi): a single message of " + std::to_string(bytes) +
                " bytes exceeds MPI's 2 GiB count limit; split the collective");
  }
  return static_cast<int>(bytes);
}

}  // namespace

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("comm (mpi) ") + what + ": " +
              std::string(text, static_cast<size_t>(length)));
}

void wait_mpi(MPI_Request* request, Watchdog& watchdog, const char* what) {
  watchdog.wait(
      [&] {
        int done = 0;
        check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
      },
      what);
}

MpiTransport::MpiTransport(MPI_Comm comm, Watchdog& watchdog) : comm_(comm), watchdog_(watchdog) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

void MpiTransport::complete(MPI_Request* requests, int count, int recv_index, size_t expected_bytes,
                            int source) {
  MPI_Status statuses[2];
  watchdog_.wait([&] {
    int done = 0;
    check_mpi(MPI_Testall(count, requests, &done, statuses), "MPI_Testall");
    return done != 0;
  });
  if (recv_index < 0) return;
  int received = 0;
  MPI_Get_count(&statuses[recv_index], MPI_BYTE, &received);
  if (static_cast<size_t>(received) != expected_bytes) {
    const CollectiveRecord& mine = watchdog_.current();
    throw Error("comm (mpi) " + mine.descriptor.describe() + ": rank " + std::to_string(rank_) +
                " expected " + std::to_string(expected_bytes) + " bytes from rank " +
                std::to_string(source) + " but got " + std::to_string(received) +
                "; buffer sizes differ between ranks");
  }
}

void MpiTransport::send(const void* data, size_t bytes, int peer) {
  MPI_Request request;
  check_mpi(MPI_Isend(data, checked_bytes(bytes), MPI_BYTE, peer, kAlgorithmTag, comm_, &request),
            "MPI_Isend");
  complete(&request, 1, -1, 0, peer);
}

void MpiTransport::recv(void* data, size_t bytes, int peer) {
  MPI_Request request;
  check_mpi(MPI_Irecv(data, checked_bytes(bytes), MPI_BYTE, peer, kAlgorithmTag, comm_, &request),
            "MPI_Irecv");
  complete(&request, 1, 0, bytes, peer);
}

void MpiTransport::sendrecv(const void* send_data, size_t send_bytes, int destination,
                            void* recv_data, size_t recv_bytes, int source) {
  MPI_Request requests[2];
  check_mpi(MPI_Irecv(recv_data, checked_bytes(recv_bytes), MPI_BYTE, source, kAlgorithmTag, comm_,
                      &requests[0]),
            "MPI_Irecv");
  check_mpi(MPI_Isend(send_data, checked_bytes(send_bytes), MPI_BYTE, destination, kAlgorithmTag,
                      comm_, &requests[1]),
            "MPI_Isend");
  complete(requests, 2, 0, recv_bytes, source);
}

}  // namespace lattice::comm
#endif
