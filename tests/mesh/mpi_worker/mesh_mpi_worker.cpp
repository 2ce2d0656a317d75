// The program the mesh tests start under mpirun: builds a Mesh over the MPI world for every valid
// layout of the world size and every split of its dp into dp_replicate x dp_shard, checks every
// group against the brute-force reference, and prints "mesh ok on N ranks, L layouts (M with the
// dp splits)" (or the failures); errors print "error: ..." and exit non-zero.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "lattice/comm/backends/mpi.hpp"
#include "lattice/core/error.hpp"
#include "lattice/mesh/mesh.hpp"
#include "mesh_reference.hpp"

int main(int argc, char** argv) {
  try {
    lattice::comm::MpiSession session;
    std::unique_ptr<lattice::comm::Communicator> world = session.world();
    int failures = 0, layouts = 0, meshes = 0;
    for (const lattice::mesh::MeshShape& shape :
         lattice::mesh::testing::all_layouts(world->size())) {
      for (int dp_shard : lattice::mesh::testing::dp_shard_sizes(shape)) {
        lattice::mesh::Mesh mesh(*world, shape, dp_shard);
        for (const std::string& failure : lattice::mesh::testing::check_mesh(mesh)) {
          std::printf("FAIL %s\n", failure.c_str());
          ++failures;
        }
        ++meshes;
      }
      ++layouts;
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world->rank() == 0 && total == 0)
      std::printf("mesh ok on %d ranks, %d layouts (%d with the dp splits)\n", world->size(),
                  layouts, meshes);
    std::fflush(stdout);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    return 2;
  }
}
