// MeshCoordinate: where a rank sits in the mesh, and the rank order that maps coordinates to global
// ranks and back. Order (innermost first) is Megatron's tp-cp-ep-dp-pp: tp, then cp, then dp, then
// pp; ep does not add ranks but regroups the dp x cp "batch" positions of one (pp, tp) place:
//   batch = cp + cp_size x dp                      (0 .. dp x cp - 1)
//   ep = batch % ep_size, expert_dp = batch / ep_size
//   rank = tp + tp_size x (batch + dp x cp x pp)
// so expert-parallel peers are the nearest non-tp ranks (cp first, then dp), as in Megatron-Core's
// expert rank generator (expert tp = tp, expert cp = 1).
#pragma once

#include <string>

#include "lattice/mesh/mesh_shape.hpp"

namespace lattice::mesh {

struct MeshCoordinate {
  int pp = 0;
  int dp = 0;
  int cp = 0;
  int tp = 0;

  bool operator==(const MeshCoordinate&) const = default;
};

// The global rank at `coordinate` (each index must lie in [0, its axis size)).
int rank_of(const MeshShape& shape, const MeshCoordinate& coordinate);
// The coordinate of global rank `rank` in [0, shape.world()).
MeshCoordinate coordinate_of(const MeshShape& shape, int rank);
// The position among the dp x cp ranks of one (pp, tp) place: cp + cp_size x dp.
int batch_index(const MeshShape& shape, const MeshCoordinate& coordinate);
// The expert-parallel coordinate (batch_index % ep) and the expert-data-parallel coordinate
// (batch_index / ep).
int expert_parallel_index(const MeshShape& shape, const MeshCoordinate& coordinate);
int expert_data_parallel_index(const MeshShape& shape, const MeshCoordinate& coordinate);

// "pp 0, dp 1, cp 0, tp 1 (ep 1, expert dp 0)".
std::string describe(const MeshShape& shape, const MeshCoordinate& coordinate);

}  // namespace lattice::mesh
