// Mesh under real mpirun: 4 processes build a Mesh for every valid layout of 4 ranks (and every
// split of its dp for HSDP) and check every group against the brute-force reference
// (tests/mesh/mpi_worker).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

#ifdef LATTICE_MESH_MPI_WORKER

TEST(MeshMpi, EveryLayoutOfFourProcessesHasTheReferenceGroups) {
  // `timeout 300` keeps a broken build from hanging CI.
  std::string command =
      "env OMPI_MCA_rmaps_base_oversubscribe=1 timeout 300 " LATTICE_MPIEXEC
      " --allow-run-as-root --oversubscribe -n 4 " LATTICE_MESH_MPI_WORKER " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe)) output.append(chunk.data(), n);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  // 4 ranks: 10 (pp, dp, cp, tp) factorizations, 20 layouts counting ep, 33 meshes counting each
  // split of dp into dp_replicate x dp_shard.
  EXPECT_NE(output.find("mesh ok on 4 ranks, 20 layouts (33 with the dp splits)"),
            std::string::npos)
      << output;
}

#else

TEST(MeshMpi, BackendNotBuilt) {
  GTEST_SKIP() << "built without MPI";
}

#endif

}  // namespace
