// The nccl backend: one process (or thread) per GPU; every collective is NCCL's on the
// communicator's CUDA stream and buffers are device (or managed) pointers. The ncclUniqueId is
// broadcast over any bootstrap communicator (MPI's, normally) or exchanged through a file for
// launches without MPI. Built when the CUDA toolkit with NCCL is found (LATTICE_HAVE_NCCL); the
// functions throw otherwise.
#pragma once

#include <memory>
#include <string>

#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

bool nccl_backend_available();

// Collective over `bootstrap`: rank 0 creates the unique id and broadcasts it; every rank then
// joins an NCCL communicator of the same rank and size on CUDA device `device`.
std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap, int device,
                                                CommOptions options = options_from_environment());

// Without a bootstrap communicator: rank 0 writes the id to `id_file` (atomically), the others wait
// for it (up to the options' timeout).
std::unique_ptr<Communicator> nccl_communicator_from_file(
    const std::string& id_file, int rank, int size, int device,
    CommOptions options = options_from_environment());

}  // namespace lattice::comm
