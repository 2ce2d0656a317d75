// An independent reference for the mesh tests (local threads and mpirun): every valid layout of a
// world, each rank's coordinates by brute-force enumeration in tp-cp-ep-dp-pp order, the members
// each group must have, and a check that runs on every rank of a Mesh and returns the failures.
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

// One rank's place found by counting: ranks are numbered with tp fastest, then cp, dp, pp.
struct ReferencePlace {
  int rank, pp, dp, cp, tp;
  int batch;    // cp + cp_size x dp, counted in the same nested loops
  int ep, edp;  // batch split as ep fastest, then expert dp
};

inline std::vector<ReferencePlace> enumerate_places(const MeshShape& s) {
  std::vector<ReferencePlace> places;
  int rank = 0;
  for (int pp = 0; pp < s.pp; ++pp) {
    int batch = 0;
    for (int dp = 0; dp < s.dp; ++dp)
      for (int cp = 0; cp < s.cp; ++cp, ++batch)
        for (int tp = 0; tp < s.tp; ++tp)
          places.push_back({rank++, pp, dp, cp, tp, batch, batch % s.ep, batch / s.ep});
  }
  return places;
}

enum class Group { pp, dp, cp, tp, ep, dp_cp, expert_dp };
inline const char* group_name(Group g) {
  const char* names[] = {"pp", "dp", "cp", "tp", "ep", "dp_cp", "expert_dp"};
  return names[static_cast<int>(g)];
}
inline constexpr Group kAllGroups[] = {Group::pp, Group::dp,    Group::cp,       Group::tp,
                                       Group::ep, Group::dp_cp, Group::expert_dp};

// The global ranks of `self`'s group, in the group's rank order (by the varying index).
inline std::vector<int> expected_members(const MeshShape& shape, int self, Group group) {
  std::vector<ReferencePlace> places = enumerate_places(shape);
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
  }
  return mesh.world();
}

// Runs on every rank of `mesh` (collective): coordinates, rank_of, and for every group its members
// (all-gathered global ranks, in order) and an allreduce that must sum exactly the members' values.
inline std::vector<std::string> check_mesh(Mesh& mesh) {
  std::vector<std::string> failures;
  const MeshShape& shape = mesh.shape();
  const int self = mesh.world().rank();
  const std::string where = describe(shape) + " rank " + std::to_string(self) + ": ";
  std::vector<ReferencePlace> places = enumerate_places(shape);
  const ReferencePlace& me = places[static_cast<size_t>(self)];
  if (mesh.coordinate(Axis::pp) != me.pp || mesh.coordinate(Axis::dp) != me.dp ||
      mesh.coordinate(Axis::cp) != me.cp || mesh.coordinate(Axis::tp) != me.tp ||
      mesh.coordinate(Axis::ep) != me.ep || mesh.expert_data_parallel_index() != me.edp)
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
    std::vector<int> expected = expected_members(shape, self, group);
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
  return failures;
}

}  // namespace lattice::mesh::testing
