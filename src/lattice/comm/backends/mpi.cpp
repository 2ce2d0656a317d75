// MpiSession: MPI initialisation and finalisation, and the world communicator.
#include "lattice/comm/backends/mpi.hpp"

#include <exception>

#include "lattice/core/error.hpp"

#if LATTICE_HAVE_MPI
#include <mpi.h>

#include "lattice/comm/backends/mpi_communicator.hpp"
#endif

namespace lattice::comm {

#if LATTICE_HAVE_MPI

bool mpi_backend_available() {
  return true;
}

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    initialized_here_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
}

MpiSession::~MpiSession() {
  // While an error unwinds, peers may be stuck in a collective: MPI_Finalize could wait for them
  // forever, so leave without it and let the launcher end the job when this process exits non-zero.
  if (std::uncaught_exceptions() > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized_here_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiSession::world(CommOptions options) const {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options, thread_multiple_);
}

#else

bool mpi_backend_available() {
  return false;
}

MpiSession::MpiSession() {
  throw Error("this build of Lattice has no MPI backend; install libopenmpi-dev and rebuild");
}
MpiSession::~MpiSession() = default;
std::unique_ptr<Communicator> MpiSession::world(CommOptions) const {
  return nullptr;
}

#endif

}  // namespace lattice::comm
