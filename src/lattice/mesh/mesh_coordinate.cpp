// MeshCoordinate: rank <-> coordinate arithmetic in tp-cp-ep-dp-pp order.
#include "lattice/mesh/mesh_coordinate.hpp"

#include "lattice/core/error.hpp"

namespace lattice::mesh {
namespace {

void check_index(const char* axis, int index, int size) {
  check(index >= 0 && index < size, "mesh: " + std::string(axis) + " coordinate " +
                                        std::to_string(index) + " is outside [0, " +
                                        std::to_string(size) + "); pass a coordinate in the mesh");
}

}  // namespace

int rank_of(const MeshShape& shape, const MeshCoordinate& coordinate) {
  check_index("pp", coordinate.pp, shape.pp);
  check_index("dp", coordinate.dp, shape.dp);
  check_index("cp", coordinate.cp, shape.cp);
  check_index("tp", coordinate.tp, shape.tp);
  return coordinate.tp +
         shape.tp * (coordinate.cp + shape.cp * (coordinate.dp + shape.dp * coordinate.pp));
}

MeshCoordinate coordinate_of(const MeshShape& shape, int rank) {
  check(rank >= 0 && rank < shape.world(),
        "mesh: rank " + std::to_string(rank) + " is outside the world of " +
            std::to_string(shape.world()) + " ranks; pass a rank in [0, " +
            std::to_string(shape.world()) + ")");
  MeshCoordinate coordinate;
  coordinate.tp = rank % shape.tp;
  rank /= shape.tp;
  coordinate.cp = rank % shape.cp;
  rank /= shape.cp;
  coordinate.dp = rank % shape.dp;
  coordinate.pp = rank / shape.dp;
  return coordinate;
}

int batch_index(const MeshShape& shape, const MeshCoordinate& coordinate) {
  return coordinate.cp + shape.cp * coordinate.dp;
}

int expert_parallel_index(const MeshShape& shape, const MeshCoordinate& coordinate) {
  return batch_index(shape, coordinate) % shape.ep;
}

int expert_data_parallel_index(const MeshShape& shape, const MeshCoordinate& coordinate) {
  return batch_index(shape, coordinate) / shape.ep;
}

std::string describe(const MeshShape& shape, const MeshCoordinate& coordinate) {
  return "pp " + std::to_string(coordinate.pp) + ", dp " + std::to_string(coordinate.dp) + ", cp " +
         std::to_string(coordinate.cp) + ", tp " + std::to_string(coordinate.tp) + " (ep " +
         std::to_string(expert_parallel_index(shape, coordinate)) + ", expert dp " +
         std::to_string(expert_data_parallel_index(shape, coordinate)) + ")";
}

}  // namespace lattice::mesh
