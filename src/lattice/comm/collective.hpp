// CollectiveDescriptor: what one collective call is (op, element type, count, reduction, root), as
// every rank must agree on it; used by the trace, the watchdog and mismatch detection.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lattice/comm/reduce_op.hpp"
#include "lattice/core/dtype.hpp"

namespace lattice::comm {

enum class CollectiveOp : uint8_t {
  allreduce,
  reduce_scatter,
  all_gather,
  all_gather_v,
  all_to_all,
  all_to_all_v,
  broadcast,
  reduce,
  barrier,
  split,
};
inline constexpr int kCollectiveOpCount = 10;

constexpr std::string_view collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::allreduce:
      return "allreduce";
    case CollectiveOp::reduce_scatter:
      return "reduce_scatter";
    case CollectiveOp::all_gather:
      return "all_gather";
    case CollectiveOp::all_gather_v:
      return "all_gather_v";
    case CollectiveOp::all_to_all:
      return "all_to_all";
    case CollectiveOp::all_to_all_v:
      return "all_to_all_v";
    case CollectiveOp::broadcast:
      return "broadcast";
    case CollectiveOp::reduce:
      return "reduce";
    case CollectiveOp::barrier:
      return "barrier";
    case CollectiveOp::split:
      return "split";
  }
  return "?";
}

// The part of a call all ranks must agree on. `count` is the per-rank element count the op is
// defined by (allreduce/broadcast/reduce: the buffer; reduce_scatter/all_gather/all_to_all: per
// rank block; the _v forms: this rank's own contribution, which may differ between ranks and is not
// compared).
struct CollectiveDescriptor {
  CollectiveOp op = CollectiveOp::barrier;
  DType dtype = DType::f32;
  ReduceOp reduce_op = ReduceOp::sum;
  int32_t root = 0;
  int64_t count = 0;

  // True when two ranks' calls can be the same collective (the _v forms compare op and type only).
  bool agrees_with(const CollectiveDescriptor& other) const {
    if (op != other.op || dtype != other.dtype) return false;
    if (op == CollectiveOp::barrier || op == CollectiveOp::split) return true;
    if (op == CollectiveOp::all_gather_v || op == CollectiveOp::all_to_all_v) return true;
    if (count != other.count) return false;
    if ((op == CollectiveOp::allreduce || op == CollectiveOp::reduce_scatter ||
         op == CollectiveOp::reduce) &&
        reduce_op != other.reduce_op)
      return false;
    if ((op == CollectiveOp::broadcast || op == CollectiveOp::reduce) && root != other.root)
      return false;
    return true;
  }

  // e.g. "allreduce(f32 x 1024, sum)" or "broadcast(bf16 x 7, root 2)".
  std::string describe() const {
    std::string text(collective_op_name(op));
    if (op == CollectiveOp::barrier || op == CollectiveOp::split) return text.append("()");
    text.append("(").append(dtype_name(dtype)).append(" x ").append(std::to_string(count));
    if (op == CollectiveOp::allreduce || op == CollectiveOp::reduce_scatter ||
        op == CollectiveOp::reduce)
      text.append(", ").append(reduce_op_name(reduce_op));
    if (op == CollectiveOp::broadcast || op == CollectiveOp::reduce)
      text.append(", root ").append(std::to_string(root));
    return text.append(")");
  }
};

}  // namespace lattice::comm
