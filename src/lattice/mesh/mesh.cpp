// Mesh: the per-axis and derived sub-communicators, built by splitting the world.
#include "lattice/mesh/mesh.hpp"

#include "lattice/core/error.hpp"

namespace lattice::mesh {
namespace {

size_t axis_slot(Axis axis) {
  return static_cast<size_t>(axis);
}

}  // namespace

Mesh::Mesh(comm::Communicator& world, MeshShape shape, int dp_shard)
    : world_(world), shape_(resolve_layout(shape, world.size())) {
  dp_shard_ = dp_shard == 0 ? shape_.dp : dp_shard;
  check_same_shape_on_every_rank();  // first, so that every rank refuses a bad dp_shard alike
  check(dp_shard_ >= 1 && shape_.dp % dp_shard_ == 0,
        "parallelism.hsdp_shard_size = " + std::to_string(dp_shard) + " does not divide dp = " +
            std::to_string(shape_.dp) + ": choose a divisor of dp (0 shards over every dp rank)");
  coordinate_ = mesh::coordinate_of(shape_, world_.rank());
  // Each group is split with color = the smallest global rank in it and key = this rank's index
  // along the group, so members come out in axis order.
  auto with = [&](auto change) {
    MeshCoordinate c = coordinate_;
    change(c);
    return mesh::rank_of(shape_, c);
  };
  // A coordinate at batch index `batch` (cp + cp_size x dp) of this rank's (pp, tp) place.
  auto at_batch = [&](int batch) {
    return with([&](MeshCoordinate& c) {
      c.cp = batch % shape_.cp;
      c.dp = batch / shape_.cp;
    });
  };
  const int batch = batch_index(shape_, coordinate_);
  const int ep_index = expert_parallel_index(shape_, coordinate_);
  const int edp_index = mesh::expert_data_parallel_index(shape_, coordinate_);

  axis_groups_[axis_slot(Axis::tp)] =
      world_.split(with([](MeshCoordinate& c) { c.tp = 0; }), coordinate_.tp);
  axis_groups_[axis_slot(Axis::cp)] =
      world_.split(with([](MeshCoordinate& c) { c.cp = 0; }), coordinate_.cp);
  axis_groups_[axis_slot(Axis::dp)] =
      world_.split(with([](MeshCoordinate& c) { c.dp = 0; }), coordinate_.dp);
  axis_groups_[axis_slot(Axis::pp)] =
      world_.split(with([](MeshCoordinate& c) { c.pp = 0; }), coordinate_.pp);
  axis_groups_[axis_slot(Axis::ep)] = world_.split(at_batch(edp_index * shape_.ep), ep_index);
  // dp = dp_shard index + dp_shard x dp_replicate index.
  const int shard_index = coordinate_.dp % dp_shard_, replica = coordinate_.dp / dp_shard_;
  axis_groups_[axis_slot(Axis::dp_shard)] =
      world_.split(with([&](MeshCoordinate& c) { c.dp = replica * dp_shard_; }), shard_index);
  axis_groups_[axis_slot(Axis::dp_replicate)] =
      world_.split(with([&](MeshCoordinate& c) { c.dp = shard_index; }), replica);
  dp_cp_ = world_.split(at_batch(0), batch);
  // The first batch position of this replica: its dp_shard x cp positions are consecutive.
  dp_shard_cp_ = world_.split(at_batch(replica * dp_shard_ * shape_.cp),
                              batch - replica * dp_shard_ * shape_.cp);
  expert_data_parallel_ = world_.split(at_batch(ep_index), edp_index);
}

Mesh::~Mesh() = default;

void Mesh::check_same_shape_on_every_rank() {
  // Largest and smallest of each size over the ranks in one allreduce (max of v and of -v).
  int32_t sizes[12] = {shape_.pp,  shape_.dp,  shape_.cp,  shape_.tp,  shape_.ep,  dp_shard_,
                       -shape_.pp, -shape_.dp, -shape_.cp, -shape_.tp, -shape_.ep, -dp_shard_};
  world_.allreduce(sizes, 12, DType::i32, comm::ReduceOp::max);
  bool same = true;
  for (int i = 0; i < 6; ++i) same = same && sizes[i] == -sizes[i + 6];
  check(same, "mesh: ranks disagree on the layout (rank " + std::to_string(world_.rank()) +
                  " has " + describe() + "); give every rank the same [parallelism] settings");
}

int Mesh::coordinate(Axis axis) const {
  switch (axis) {
    case Axis::pp:
      return coordinate_.pp;
    case Axis::dp:
      return coordinate_.dp;
    case Axis::cp:
      return coordinate_.cp;
    case Axis::tp:
      return coordinate_.tp;
    case Axis::ep:
      return expert_parallel_index(shape_, coordinate_);
    case Axis::dp_replicate:
      return coordinate_.dp / dp_shard_;
    case Axis::dp_shard:
      return coordinate_.dp % dp_shard_;
  }
  return 0;
}

int Mesh::size(Axis axis) const {
  switch (axis) {
    case Axis::pp:
      return shape_.pp;
    case Axis::dp:
      return shape_.dp;
    case Axis::cp:
      return shape_.cp;
    case Axis::tp:
      return shape_.tp;
    case Axis::ep:
      return shape_.ep;
    case Axis::dp_replicate:
      return shape_.dp / dp_shard_;
    case Axis::dp_shard:
      return dp_shard_;
  }
  return 0;
}

comm::Communicator& Mesh::group(Axis axis) {
  return *axis_groups_[axis_slot(axis)];
}

AxisGroups Mesh::axis_groups() {
  AxisGroups groups{};
  for (Axis axis : kAllAxes) groups[axis_slot(axis)] = axis_groups_[axis_slot(axis)].get();
  return groups;
}

int Mesh::expert_data_parallel_index() const {
  return mesh::expert_data_parallel_index(shape_, coordinate_);
}

int Mesh::rank_of(const MeshCoordinate& coordinate) const {
  return mesh::rank_of(shape_, coordinate);
}

MeshCoordinate Mesh::coordinate_of(int rank) const {
  return mesh::coordinate_of(shape_, rank);
}

std::string Mesh::describe() const {
  std::string text = mesh::describe(shape_);
  if (dp_shard_ != shape_.dp)
    text += " (dp_replicate " + std::to_string(shape_.dp / dp_shard_) + " x dp_shard " +
            std::to_string(dp_shard_) + ")";
  return text;
}

std::string Mesh::describe_rank() const {
  return "rank " + std::to_string(world_.rank()) + " of " + std::to_string(world_.size()) + ": " +
         mesh::describe(shape_, coordinate_);
}

}  // namespace lattice::mesh
