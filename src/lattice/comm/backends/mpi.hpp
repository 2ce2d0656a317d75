// The mpi backend's entry point: MpiSession initialises MPI (thread-multiple when offered) unless
// the program already did, finalises it at the end if it initialised it, and hands out the world
// communicator (destroy communicators before the session). When an exception unwinds through the
// session it skips MPI_Finalize, so the process exits and the launcher ends the job. One process
// per rank, started by mpirun / srun. Available when LATTICE_HAVE_MPI.
#pragma once

#include <memory>

#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

// True when this build has the MPI backend.
bool mpi_backend_available();

class MpiSession {
 public:
  // Throws Error when the build has no MPI backend.
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // A communicator over MPI_COMM_WORLD (a duplicate of it; call it once per use).
  std::unique_ptr<Communicator> world(CommOptions options = options_from_environment()) const;
  // Whether MPI granted MPI_THREAD_MULTIPLE (without it asynchronous collectives run inline).
  bool thread_multiple() const { return thread_multiple_; }

 private:
  bool initialized_here_ = false;
  bool thread_multiple_ = false;
};

}  // namespace lattice::comm
