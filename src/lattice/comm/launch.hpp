// Launch detection: this process's rank, world size, local rank and node from the launcher's
// environment - torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK), Open MPI
// (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
// SLURM_NNODES), PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS) and PMIx (PMIX_RANK).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace lattice::comm {

enum class Launcher { none, torchrun, open_mpi, slurm, pmi, pmix };

std::string_view launcher_name(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;  // ranks on this node
  int node = 0;
  int node_count = 1;
  // True when node and node_count came from the launcher rather than from rank / local_size.
  bool node_from_launcher = false;

  bool launched() const { return launcher != Launcher::none; }
  // e.g. "open_mpi: rank 3 of 8, local rank 1 of 4, node 0 of 2".
  std::string describe() const;
};

// Reads the variables through `lookup` (nullptr when unset); malformed values throw Error naming
// the variable. The first launcher whose rank variable is set wins, in the order listed above.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& lookup);
// The same over the process environment.
LaunchInfo detect_launch();

}  // namespace lattice::comm
