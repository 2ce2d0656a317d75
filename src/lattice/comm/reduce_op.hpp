// ReduceOp: the element-wise reductions collectives apply (sum, avg, max, min), and their names.
#pragma once

#include <cstdint>
#include <string_view>

namespace lattice::comm {

// avg is a sum divided by the number of ranks once at the end (integers divide truncating toward
// zero).
enum class ReduceOp : uint8_t { sum, avg, max, min };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

}  // namespace lattice::comm
