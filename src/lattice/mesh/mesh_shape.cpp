// MeshShape: layout resolution against the world size and the model's dimensions.
#include "lattice/mesh/mesh_shape.hpp"

#include <string>

#include "lattice/core/error.hpp"

namespace lattice::mesh {
namespace {

std::string str(int value) {
  return std::to_string(value);
}

void check_positive(const char* key, int value) {
  check(value >= 1, "parallelism: " + std::string(key) + " = " + str(value) +
                        " is not a positive size; set [parallelism] " + key + " (--" + key +
                        ") to 1 or more");
}

}  // namespace

MeshShape resolve_layout(MeshShape requested, int world_size) {
  check(world_size >= 1, "parallelism: world size " + str(world_size) +
                             " is not positive; start at least one rank (--ranks or mpirun -n)");
  check_positive("pp", requested.pp);
  check_positive("cp", requested.cp);
  check_positive("tp", requested.tp);
  check_positive("ep", requested.ep);
  check(requested.dp >= 1 || requested.dp == -1,
        "parallelism: dp = " + str(requested.dp) +
            " is not a positive size; set [parallelism] dp (--dp) to 1 or more, or to -1 to infer "
            "it from the world size");
  MeshShape shape = requested;
  if (requested.dp == -1) {
    int model_ranks = requested.pp * requested.cp * requested.tp;
    check(world_size % model_ranks == 0,
          "parallelism: world size " + str(world_size) + " is not divisible by pp x cp x tp = " +
              str(model_ranks) + " (pp " + str(requested.pp) + ", cp " + str(requested.cp) +
              ", tp " + str(requested.tp) + "); choose pp, cp and tp whose product divides " +
              str(world_size) + ", or run on a multiple of " + str(model_ranks) + " ranks");
    shape.dp = world_size / model_ranks;
  }
  check(shape.world() == world_size, "parallelism: pp x dp x cp x tp = " + str(shape.world()) +
                                         " (pp " + str(shape.pp) + ", dp " + str(shape.dp) +
                                         ", cp " + str(shape.cp) + ", tp " + str(shape.tp) +
                                         ") does not equal the world size " + str(world_size) +
                                         "; change the sizes so their product is " +
                                         str(world_size) + ", or set dp = -1 to infer it");
  check(shape.batch_parallel() % shape.ep == 0,
        "parallelism: ep " + str(shape.ep) + " does not divide dp x cp = " +
            str(shape.batch_parallel()) + " (dp " + str(shape.dp) + ", cp " + str(shape.cp) +
            "); choose an ep that divides " + str(shape.batch_parallel()));
  return shape;
}

std::string describe(const MeshShape& shape) {
  return "pp " + str(shape.pp) + " x dp " + str(shape.dp) + " x cp " + str(shape.cp) + " x tp " +
         str(shape.tp) + " (ep " + str(shape.ep) + ")";
}

}  // namespace lattice::mesh
