// The MPI backend under real mpirun: the collective suite (native and Lattice's algorithms) on 1-8
// processes, with the TCP transport forced as between nodes, emulated nodes for the two-level
// allreduce, and the failure scenarios (missing rank, mismatched call, dead rank) ending in errors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

#ifdef LATTICE_COMM_MPI_WORKER

struct Outcome {
  int status = -1;
  std::string output;
};

// Starts the worker on `ranks` processes; `timeout 300` keeps a broken build from hanging CI.
Outcome run_worker(int ranks, const std::string& arguments, const std::string& mpirun_flags = "",
                   const std::string& environment = "") {
  std::string command = "env OMPI_MCA_rmaps_base_oversubscribe=1 " + environment +
                        " timeout 300 " LATTICE_MPIEXEC " --allow-run-as-root --oversubscribe -n " +
                        std::to_string(ranks) + " " + mpirun_flags +
                        " " LATTICE_COMM_MPI_WORKER " " + arguments + " 2>&1";
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return outcome;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe))
    outcome.output.append(chunk.data(), n);
  int status = pclose(pipe);
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

const char* kAllAlgorithms = "native,ring,tree,halving_doubling,pairwise";

class MpiSuite : public ::testing::TestWithParam<int> {};

TEST_P(MpiSuite, EveryCollectiveAndAlgorithmMatchesReference) {
  int ranks = GetParam();
  Outcome outcome = run_worker(ranks, std::string("suite 0,1,7,1023 all ") + kAllAlgorithms);
  EXPECT_EQ(outcome.status, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("suite ok on " + std::to_string(ranks) + " ranks"),
            std::string::npos)
      << outcome.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiSuite, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(MpiLarge, MillionElementsMatchReference) {
  Outcome outcome = run_worker(3, "suite 1000003 f32,bf16 native,ring,halving_doubling");
  EXPECT_EQ(outcome.status, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("suite ok on 3 ranks"), std::string::npos) << outcome.output;
}

TEST(MpiTcp, SuiteOverTcpTransport) {
  Outcome outcome =
      run_worker(4, std::string("suite 0,1,7,1023 all ") + kAllAlgorithms, "--mca btl tcp,self");
  EXPECT_EQ(outcome.status, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("suite ok on 4 ranks"), std::string::npos) << outcome.output;
}

TEST(MpiHierarchical, EmulatedNodesMatchReference) {
  Outcome outcome =
      run_worker(5, "suite 0,1,7,1023 all hierarchical", "", "LATTICE_COMM_RANKS_PER_NODE=2");
  EXPECT_EQ(outcome.status, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("suite ok on 5 ranks, node count 3"), std::string::npos)
      << outcome.output;
}

TEST(MpiWatchdog, MissingRankIsNamed) {
  Outcome outcome = run_worker(3, "missing");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, 124) << "the job hung until the outer timeout";
  EXPECT_NE(outcome.output.find("ranks that did not arrive: 2"), std::string::npos)
      << outcome.output;
  EXPECT_NE(outcome.output.find("rank 2: #1 allreduce(f32 x 1, sum)"), std::string::npos)
      << outcome.output;
}

TEST(MpiWatchdog, MismatchedCollectiveIsReported) {
  Outcome outcome = run_worker(3, "mismatch");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.output.find("collective mismatch at #1"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("allreduce(f32 x 10, sum)"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("allreduce(f32 x 12, sum)"), std::string::npos) << outcome.output;
}

TEST(MpiWatchdog, DeadRankEndsTheJob) {
  Outcome outcome = run_worker(3, "exit");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, 124) << "the job hung until the outer timeout";
}

#else

TEST(Mpi, BackendNotBuilt) {
  GTEST_SKIP() << "built without MPI";
}

#endif

}  // namespace
