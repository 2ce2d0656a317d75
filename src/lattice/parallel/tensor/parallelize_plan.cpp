// The parallelize plan's table lookup: see parallelize_plan.hpp.
#include "lattice/parallel/tensor/parallelize_plan.hpp"

namespace lattice::parallel {

TensorSplit ParallelizePlan::split(ProjectionRole role) const {
  switch (role) {
    case ProjectionRole::attention_input:
      return attention_input;
    case ProjectionRole::attention_output:
      return attention_output;
    case ProjectionRole::mlp_input:
      return mlp_input;
    case ProjectionRole::mlp_output:
      return mlp_output;
    case ProjectionRole::routed_experts:
      return routed_experts;
  }
  return TensorSplit::none;
}

}  // namespace lattice::parallel
