// Mesh: the single source of truth for rank layout. Named axes (pp, dp, cp, tp, ep carved out of
// dp x cp, and dp's sub-axes dp_replicate x dp_shard for HSDP) over a world communicator, one
// sub-communicator per axis, and the derived groups that gradient and loss reductions use: the
// batch group (dp x cp), the ZeRO shard group (dp_shard x cp) and the expert-data-parallel group.
// Rank order is Megatron's tp-cp-ep-dp-pp (see mesh_coordinate.hpp); inside dp, dp_shard is
// innermost (dp = dp_shard index + dp_shard x dp_replicate index, torchtitan's ParallelDims), so
// the ranks that shard the state are consecutive dp ranks. No global state: modules are handed the
// communicators they need, and nothing else splits a communicator.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "lattice/comm/communicator.hpp"
#include "lattice/mesh/mesh_axis.hpp"
#include "lattice/mesh/mesh_coordinate.hpp"
#include "lattice/mesh/mesh_shape.hpp"

namespace lattice::mesh {

// The communicator of each axis, indexed by Axis (null: an axis of one rank, or none at hand).
using AxisGroups = std::array<comm::Communicator*, kAllAxes.size()>;

class Mesh {
 public:
  // Collective over `world` (every rank calls it with the same shape; it checks that they agree
  // with one allreduce, then splits `world` ten times). `shape` is resolved against world.size()
  // first (dp = -1 is inferred; a layout that does not divide throws lattice::Error). `dp_shard`
  // splits dp for HSDP: dp_shard ranks shard the state, dp / dp_shard replicate it (0: dp_shard =
  // dp, one replica; it must divide dp). `world` must outlive the mesh.
  Mesh(comm::Communicator& world, MeshShape shape, int dp_shard = 0);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  const MeshCoordinate& coordinate() const { return coordinate_; }
  // This rank's index along `axis` (for ep: its expert-parallel index within dp x cp; for
  // dp_shard and dp_replicate: dp % dp_shard and dp / dp_shard).
  int coordinate(Axis axis) const;
  int size(Axis axis) const;

  // The ranks that differ from this one only in `axis`, ordered by their index along it. For ep:
  // the ep ranks of this rank's expert-data-parallel index (same pp and tp), which exchange tokens.
  comm::Communicator& group(Axis axis);
  // The batch group: the dp x cp ranks of this (pp, tp) place, ordered by batch index
  // (cp + cp_size x dp). Gradients of replicated (non-expert) parameters and the loss are reduced
  // over it.
  comm::Communicator& dp_cp() { return *dp_cp_; }
  // The ZeRO shard group: the dp_shard x cp ranks of this (pp, tp, dp_replicate) place, ordered by
  // batch index. ZeRO shards parameters, gradients and optimizer state over it; with one replica
  // (no HSDP) it is the batch group.
  comm::Communicator& dp_shard_cp() { return *dp_shard_cp_; }
  // The expert-data-parallel group: the dp x cp / ep ranks of this (pp, tp) place that hold the
  // same experts (same ep index), ordered by expert-data-parallel index. Gradients of expert
  // parameters are reduced over it.
  comm::Communicator& expert_data_parallel() { return *expert_data_parallel_; }
  int expert_data_parallel_index() const;
  comm::Communicator& world() { return world_; }
  // Every axis' group (for code that takes the groups of several axes, e.g. the gradient norm).
  AxisGroups axis_groups();

  // Global rank of a coordinate tuple, and the coordinate of a global rank.
  int rank_of(const MeshCoordinate& coordinate) const;
  int rank_of(int pp, int dp, int cp, int tp) const {
    return rank_of(MeshCoordinate{pp, dp, cp, tp});
  }
  MeshCoordinate coordinate_of(int rank) const;

  // "pp 1 x dp 2 x cp 1 x tp 2 (ep 1)", and " (dp_replicate 2 x dp_shard 2)" after it with HSDP.
  std::string describe() const;
  // "rank 3 of 4: pp 0, dp 1, cp 0, tp 1 (ep 1, expert dp 0)".
  std::string describe_rank() const;

 private:
  // Collective: throws lattice::Error on every rank when the ranks' resolved shapes differ.
  void check_same_shape_on_every_rank();

  comm::Communicator& world_;
  MeshShape shape_;
  int dp_shard_ = 1;
  MeshCoordinate coordinate_;
  std::array<std::unique_ptr<comm::Communicator>, kAllAxes.size()> axis_groups_;
  std::unique_ptr<comm::Communicator> dp_cp_;
  std::unique_ptr<comm::Communicator> dp_shard_cp_;
  std::unique_ptr<comm::Communicator> expert_data_parallel_;
};

}  // namespace lattice::mesh
