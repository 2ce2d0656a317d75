// Shared by the multi-process CLI tests: `mpirun -np N lattice <args>` (or another program) in a
// test directory, with oversubscription allowed and a 120 s timeout that keeps a hang from
// blocking CI (only where the build found an MPI launcher: LATTICE_MPIEXEC).
#pragma once

#ifdef LATTICE_MPIEXEC
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../train/cli_runner.hpp"

namespace lattice::testing {

// `mpirun -np ranks program args` (any program; run_mpi runs the `lattice` CLI).
inline CliResult run_mpi_program(const std::string& program, int ranks, const std::string& args,
                                 const std::filesystem::path& dir,
                                 const std::string& mpirun_flags = "",
                                 const std::string& env = "") {
  const std::string command =
      "env OMPI_MCA_rmaps_base_oversubscribe=1 LATTICE_COMM_TIMEOUT_MS=60000 " + env +
      " timeout 120 " LATTICE_MPIEXEC " --allow-run-as-root --oversubscribe -n " +
      std::to_string(ranks) + " " + mpirun_flags + " '" + program + "' " + args;
  const std::filesystem::path out = dir / "mpi.out", err = dir / "mpi.err";
  const int raw = std::system(("cd '" + dir.string() + "' && " + command + " > '" + out.string() +
                               "' 2> '" + err.string() + "' < /dev/null")
                                  .c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline CliResult run_mpi(int ranks, const std::string& args, const std::filesystem::path& dir,
                         const std::string& mpirun_flags = "", const std::string& env = "") {
  return run_mpi_program(LATTICE_BINARY, ranks, args, dir, mpirun_flags, env);
}

}  // namespace lattice::testing

#endif
