// The optional backends are built when their toolkits are present and refuse clearly when not; the
// nccl backend links here and runs where a GPU is lent (tests/comm/gpu/run_nccl_check.sh).
#include <gtest/gtest.h>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/backends/nccl.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

TEST(Backends, MpiAvailabilityMatchesTheBuild) {
#if LATTICE_HAVE_MPI
  EXPECT_TRUE(mpi_backend_available());
#else
  EXPECT_FALSE(mpi_backend_available());
  EXPECT_THROW(MpiSession(), Error);
#endif
}

TEST(Backends, NcclAvailabilityMatchesTheBuild) {
#if LATTICE_HAVE_NCCL
  EXPECT_TRUE(nccl_backend_available());
#else
  EXPECT_FALSE(nccl_backend_available());
  LocalWorld world(1);
  auto bootstrap = world.take(0);
  EXPECT_THROW(nccl_communicator(*bootstrap, 0), Error);
#endif
}

}  // namespace
}  // namespace lattice::comm
