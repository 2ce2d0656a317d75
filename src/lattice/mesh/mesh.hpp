// Mesh: the single source of truth for rank layout. Named axes (pp, dp, cp, tp, and ep carved out
// of dp x cp) over a world communicator, one sub-communicator per axis, and the derived groups that
// gradient and loss reductions use: the batch group (dp x cp) and the expert-data-parallel group.
// Rank order is Megatron's tp-cp-ep-dp-pp (see mesh_coordinate.hpp). No global state: modules are
// handed the communicators they need.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "lattice/comm/communicator.hpp"
#include "lattice/mesh/mesh_coordinate.hpp"
#include "lattice/mesh/mesh_shape.hpp"

namespace lattice::mesh {

enum class Axis { pp, dp, cp, tp, ep };
inline constexpr std::array<Axis, 5> kAllAxes = {Axis::pp, Axis::dp, Axis::cp, Axis::tp, Axis::ep};
std::string_view axis_name(Axis axis);

class Mesh {
 public:
  // Collective over `world` (every rank calls it with the same shape; it checks that they agree
  // with one allreduce, then splits `world` seven times). `shape` is resolved against world.size()
  // first (dp = -1 is inferred; a layout that does not divide throws lattice::Error). `world` must
  // outlive the mesh.
  Mesh(comm::Communicator& world, MeshShape shape);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  const MeshCoordinate& coordinate() const { return coordinate_; }
  // This rank's index along `axis` (for ep: its expert-parallel index within dp x cp).
  int coordinate(Axis axis) const;
  int size(Axis axis) const;

  // The ranks that differ from this one only in `axis`, ordered by their index along it. For ep:
  // the ep ranks of this rank's expert-data-parallel index (same pp and tp), which exchange tokens.
  comm::Communicator& group(Axis axis);
  // The batch group: the dp x cp ranks of this (pp, tp) place, ordered by batch index
  // (cp + cp_size x dp). Gradients of replicated (non-expert) parameters and the loss are reduced
  // over it.
  comm::Communicator& dp_cp() { return *dp_cp_; }
  // The expert-data-parallel group: the dp x cp / ep ranks of this (pp, tp) place that hold the
  // same experts (same ep index), ordered by expert-data-parallel index. Gradients of expert
  // parameters are reduced over it.
  comm::Communicator& expert_data_parallel() { return *expert_data_parallel_; }
  int expert_data_parallel_index() const;
  comm::Communicator& world() { return world_; }

  // Global rank of a coordinate tuple, and the coordinate of a global rank.
  int rank_of(const MeshCoordinate& coordinate) const;
  int rank_of(int pp, int dp, int cp, int tp) const {
    return rank_of(MeshCoordinate{pp, dp, cp, tp});
  }
  MeshCoordinate coordinate_of(int rank) const;

  // "pp 1 x dp 2 x cp 1 x tp 2 (ep 1)".
  std::string describe() const;
  // "rank 3 of 4: pp 0, dp 1, cp 0, tp 1 (ep 1, expert dp 0)".
  std::string describe_rank() const;

 private:
  // Collective: throws lattice::Error on every rank when the ranks' resolved shapes differ.
  void check_same_shape_on_every_rank();

  comm::Communicator& world_;
  MeshShape shape_;
  MeshCoordinate coordinate_;
  std::array<std::unique_ptr<comm::Communicator>, kAllAxes.size()> axis_groups_;
  std::unique_ptr<comm::Communicator> dp_cp_;
  std::unique_ptr<comm::Communicator> expert_data_parallel_;
};

}  // namespace lattice::mesh
