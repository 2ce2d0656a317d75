// An independent reference for the mesh tests (local threads and mpirun): every valid layout of a
// world, each rank's coordinates by brute-force enumeration in tp-cp-ep-dp-pp order (dp split as
// dp_shard fastest, then dp_replicate), the members each group must have, and a check that runs
// on every rank of a Mesh and returns the failures.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lattice/mesh/mesh.hpp"

namespace lattice::mesh::testing {

// Every (pp, dp, cp, tp, ep) whose product pp x dp x cp x tp is `world` and whose ep divides dp x
// cp.
inline std::vector<MeshShape> all_layouts(int world) {
  std::vector<MeshShape> layouts;
  for (int pp = 1; pp <= world; ++pp)
    for (int dp = 1; dp <= world; ++dp)
      for (int cp = 1; cp <= world; ++cp)
        for (int tp = 1; tp <= world; ++tp) {
          if (pp * dp * cp * tp != world) continue;
          for (int ep = 1; ep <= dp * cp; ++ep) {
            if ((dp * cp) % ep == 0) layouts.push_back(MeshShape{pp, dp, cp, tp, ep});
          }
        }
  return layouts;
}

// The dp_shard sizes a layout allows: every divisor of dp.
inline std::vector<int> dp_shard_sizes(const MeshShape& shape) {
  std::vector<int> sizes;
  for (int s = 1; s <= shape.dp; ++s)
    if (shape.dp % s == 0) sizes.push_back(s);
  return sizes;
}

// One rank's place found by counting: ranks are numbered with tp fastest, then cp, dp, pp; the dp
// positions with dp_shard fastest, then dp_replicate.
struct ReferencePlace {
  int rank, pp, dp, cp, tp;
  int batch;    // cp + cp_size x dp, counted in the same nested loops
  int ep, edp;  // batch split as ep fastest, then expert dp
  int dp_replicate, dp_shard;
};

inline std::vector<ReferencePlace> enumerate_places(const MeshShape& s, int dp_shard) {
  std::vector<ReferencePlace> places;
  int rank = 0;
  for (int pp = 0; pp < s.pp; ++pp) {
    int batch = 0, dp = 0;
    for (int replica = 0; replica < s.dp / dp_shard; ++replica)
      for (int shard = 0; shard < dp_shard; ++shard, ++dp)
        for (int cp = 0; cp < s.cp; ++cp, ++batch)
          for (int tp = 0; tp < s.tp; ++tp)
            places.push_back(
                {rank++, pp, dp, cp, tp, batch, batch % s.ep, batch / s.ep, replica, shard});
  }
  return places;
}

enum class Group { pp, dp, cp, tp, ep, dp_cp, expert_dp, dp_replicate, dp_shard, dp_shard_cp };
inline const char* group_name(Group g) {
  const char* names[] = {"pp",    "dp",        "cp",           "tp",       "ep",
                         "dp_cp", "expert_dp", "dp_replicate", "dp_shard", "dp_shard_cp"};
  return names[static_cast<int>(g)];
}
inline constexpr Group kAllGroups[] = {
    Group::pp,    Group::dp,        Group::cp,           Group::tp,       Group::ep,
    Group::dp_cp, Group::expert_dp, Group::dp_replicate, Group::dp_shard, Group::dp_shard_cp};

// The global ranks of `self`'s group, in the group's rank order (by the varying index).
inline std::vector<int> expected_members(const MeshShape& shape, int dp_shard, int self,
                                         Group group) {
  std::vector<ReferencePlace> places = enumerate_places(shape, dp_shard);
  const ReferencePlace& me = places[static_cast<size_t>(self)];
  std::vector<std::pair<int, int>> members;  // (order key, rank)
  for (const ReferencePlace& p : places) {
    bool same_pp = p.pp == me.pp, same_tp = p.tp == me.tp;
    switch (group) {
      case Group::pp:
        if (p.dp == me.dp && p.cp == me.cp && same_tp) members.push_back({p.pp, p.rank});
        break;
      case Group::dp:
        if (same_pp && p.cp == me.cp && same_tp) members.push_back({p.dp, p.rank});
        break;
      case Group::cp:
        if (same_pp && p.dp == me.dp && same_tp) members.push_back({p.cp, p.rank});
        break;
      case Group::tp:
        if (same_pp && p.dp == me.dp && p.cp == me.cp) members.push_back({p.tp, p.rank});
        break;
      case Group::ep:
        if (same_pp && same_tp && p.edp == me.edp) members.push_back({p.ep, p.rank});
        break;
      case Group::dp_cp:
        if (same_pp && same_tp) members.push_back({p.batch, p.rank});
        break;
      case Group::expert_dp:
        if (same_pp && same_tp && p.ep == me.ep) members.push_back({p.edp, p.rank});
        break;
      case Group::dp_replicate:
        if (same_pp && same_tp && p.cp == me.cp && p.dp_shard == me.dp_shard)
          members.push_back({p.dp_replicate, p.rank});
        break;
      case Group::dp_shard:
        if (same_pp && same_tp && p.cp == me.cp && p.dp_replicate == me.dp_replicate)
          members.push_back({p.dp_shard, p.rank});
        break;
      case Group::dp_shard_cp:
        if (same_pp && same_tp && p.dp_replicate == me.dp_replicate)
          members.push_back({p.batch, p.rank});
        break;
    }
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (auto& m : members) ranks.push_back(m.second);
  return ranks;
}

inline comm::Communicator& group_of(Mesh& mesh, Group group) {
  switch (group) {
    case Group::pp:
      return mesh.group(Axis::pp);
    case Group::dp:
      return mesh.group(Axis::dp);
    case Group::cp:
      return mesh.group(Axis::cp);
    case Group::tp:
      return mesh.group(Axis::tp);
    case Group::ep:
      return mesh.group(Axis::ep);
    case Group::dp_cp:
      return mesh.dp_cp();
    case Group::expert_dp:
      return mesh.expert_data_parallel();
    case Group::dp_replicate:
      return mesh.group(Axis::dp_replicate);
    case Group::dp_shard:
      return mesh.group(Axis::dp_shard);
    case Group::dp_shard_cp:
      return mesh.dp_shard_cp();
  }
  return mesh.world();
}

// Runs on every rank of `mesh` (collective): coordinates, rank_of, and for every group its members
// (all-gathered global ranks, in order) and an allreduce that must sum exactly the members' values.
inline std::vector<std::string> check_mesh(Mesh& mesh) {
  std::vector<std::string> failures;
  const MeshShape& shape = mesh.shape();
  const int self = mesh.world().rank();
  const int dp_shard = mesh.size(Axis::dp_shard);
  const std::string where = mesh.describe() + " rank " + std::to_string(self) + ": ";
  if (dp_shard * mesh.size(Axis::dp_replicate) != shape.dp) {
    failures.push_back(where + "dp_shard x dp_replicate is not dp");
    return failures;
  }
  std::vector<ReferencePlace> places = enumerate_places(shape, dp_shard);
  const ReferencePlace& me = places[static_cast<size_t>(self)];
  if (mesh.coordinate(Axis::pp) != me.pp || mesh.coordinate(Axis::dp) != me.dp ||
      mesh.coordinate(Axis::cp) != me.cp || mesh.coordinate(Axis::tp) != me.tp ||
      mesh.coordinate(Axis::ep) != me.ep || mesh.expert_data_parallel_index() != me.edp ||
      mesh.coordinate(Axis::dp_replicate) != me.dp_replicate ||
      mesh.coordinate(Axis::dp_shard) != me.dp_shard)
    failures.push_back(where + "coordinates " + mesh.describe_rank());
  for (const ReferencePlace& p : places) {
    if (mesh.rank_of(p.pp, p.dp, p.cp, p.tp) != p.rank)
      failures.push_back(where + "rank_of gives " +
                         std::to_string(mesh.rank_of(p.pp, p.dp, p.cp, p.tp)) + " for rank " +
                         std::to_string(p.rank));
    if (!(mesh.coordinate_of(p.rank) == MeshCoordinate{p.pp, p.dp, p.cp, p.tp}))
      failures.push_back(where + "coordinate_of " + std::to_string(p.rank));
  }
  for (Group group : kAllGroups) {
    comm::Communicator& comm = group_of(mesh, group);
    std::vector<int> expected = expected_members(shape, dp_shard, self, group);
    std::string name = where + group_name(group) + " group: ";
    if (comm.size() != static_cast<int>(expected.size())) {
      failures.push_back(name + "size " + std::to_string(comm.size()) + ", expected " +
                         std::to_string(expected.size()));
      continue;
    }
    int32_t mine = self;
    std::vector<int32_t> gathered(expected.size(), -1);
    comm.all_gather(&mine, gathered.data(), 1, DType::i32);
    if (!std::equal(gathered.begin(), gathered.end(), expected.begin()))
      failures.push_back(name + "members out of order or wrong");
    if (expected[static_cast<size_t>(comm.rank())] != self)
      failures.push_back(name + "this rank at position " + std::to_string(comm.rank()));
    // Each rank contributes bit `rank` (plus its rank in the high bits): the sum names the members.
    int64_t value = (int64_t{1} << self) + (int64_t{self} << 32), expected_sum = 0;
    for (int r : expected) expected_sum += (int64_t{1} << r) + (int64_t{r} << 32);
    comm.allreduce(&value, 1, DType::i64, comm::ReduceOp::sum);
    if (value != expected_sum)
      failures.push_back(name + "allreduce sum " + std::to_string(value) + ", expected " +
                         std::to_string(expected_sum));
  }
  if (mesh.size(Axis::ep) != shape.ep || mesh.group(Axis::ep).size() != shape.ep)
    failures.push_back(where + "ep size");
  // axis_groups() hands out the same communicators as group().
  const AxisGroups groups = mesh.axis_groups();
  for (Axis axis : kAllAxes)
    if (groups[static_cast<size_t>(axis)] != &mesh.group(axis) ||
        mesh.group(axis).size() != mesh.size(axis))
      failures.push_back(where + std::string(axis_name(axis)) + " in axis_groups()");
  return failures;
}

}  // namespace lattice::mesh::testing
