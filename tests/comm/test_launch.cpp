// Launch detection from torchrun, Open MPI, Slurm, PMI and PMIx environments (fake environments).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

LaunchInfo detect(const std::map<std::string, std::string>& variables) {
  return detect_launch([&](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
}

TEST(Launch, NothingSetMeansSingleRank) {
  LaunchInfo info = detect({});
  EXPECT_FALSE(info.launched());
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.rank, 0);
}

TEST(Launch, Torchrun) {
  LaunchInfo info = detect({{"RANK", "5"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "4"},
                            {"GROUP_RANK", "1"}});
  EXPECT_EQ(info.launcher, Launcher::torchrun);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.node, 1);
  EXPECT_EQ(info.node_count, 2);
  EXPECT_EQ(info.describe(), "torchrun: rank 5 of 8, local rank 1 of 4, node 1 of 2");
}

TEST(Launch, OpenMpiDerivesNodesFromLocalSize) {
  LaunchInfo info = detect({{"OMPI_COMM_WORLD_RANK", "6"},
                            {"OMPI_COMM_WORLD_SIZE", "8"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(info.launcher, Launcher::open_mpi);
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.node, 1);
  EXPECT_EQ(info.node_count, 2);
  EXPECT_FALSE(info.node_from_launcher);
}

TEST(Launch, Slurm) {
  LaunchInfo info = detect({{"SLURM_PROCID", "9"},
                            {"SLURM_NTASKS", "12"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "2"},
                            {"SLURM_NNODES", "3"}});
  EXPECT_EQ(info.launcher, Launcher::slurm);
  EXPECT_EQ(info.rank, 9);
  EXPECT_EQ(info.world_size, 12);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.node, 2);
  EXPECT_EQ(info.node_count, 3);
  EXPECT_TRUE(info.node_from_launcher);
}

TEST(Launch, PmiAndPmix) {
  LaunchInfo pmi = detect(
      {{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(pmi.launcher, Launcher::pmi);
  EXPECT_EQ(pmi.rank, 3);
  EXPECT_EQ(pmi.node, 1);
  LaunchInfo pmix = detect({{"PMIX_RANK", "2"}});
  EXPECT_EQ(pmix.launcher, Launcher::pmix);
  EXPECT_EQ(pmix.rank, 2);
}

TEST(Launch, TorchrunWinsOverOpenMpi) {
  LaunchInfo info = detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_EQ(info.launcher, Launcher::torchrun);
}

TEST(Launch, MalformedValuesNameTheVariable) {
  try {
    detect({{"RANK", "two"}, {"WORLD_SIZE", "4"}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='two'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detect({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), Error);
}

}  // namespace
}  // namespace lattice::comm
