// Algorithm names, support table and the automatic selection rule.
#include "lattice/comm/algorithm.hpp"

#include "lattice/core/error.hpp"

namespace lattice::comm {

Algorithm parse_algorithm(std::string_view name) {
  for (int i = 0; i < kAlgorithmCount; ++i) {
    auto algorithm = static_cast<Algorithm>(i);
    if (algorithm_name(algorithm) == name) return algorithm;
  }
  throw Error("unknown collective algorithm '" + std::string(name) +
              "'; use one of auto, ring, tree, halving_doubling, direct, pairwise, hierarchical, "
              "native");
}

bool algorithm_supports(Algorithm algorithm, CollectiveOp op) {
  switch (algorithm) {
    case Algorithm::automatic:
    case Algorithm::direct:
    case Algorithm::native:
      return true;
    case Algorithm::ring:
      return op == CollectiveOp::allreduce || op == CollectiveOp::reduce_scatter ||
             op == CollectiveOp::all_gather || op == CollectiveOp::all_gather_v;
    case Algorithm::tree:
      return op == CollectiveOp::allreduce || op == CollectiveOp::broadcast ||
             op == CollectiveOp::reduce || op == CollectiveOp::barrier;
    case Algorithm::halving_doubling:
      return op == CollectiveOp::allreduce;
    case Algorithm::pairwise:
      return op == CollectiveOp::all_to_all || op == CollectiveOp::all_to_all_v;
    case Algorithm::hierarchical:
      return op == CollectiveOp::allreduce;
  }
  return false;
}

Algorithm select_algorithm(CollectiveOp op, int64_t bytes, int ranks,
                           const AlgorithmCapabilities& capabilities) {
  if (capabilities.shared_address_space) return Algorithm::direct;
  if (capabilities.native && capabilities.prefer_native) return Algorithm::native;
  switch (op) {
    case CollectiveOp::allreduce:
      return bytes <= (int64_t{256} << 10) || ranks <= 2 ? Algorithm::halving_doubling
                                                         : Algorithm::ring;
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather:
    case CollectiveOp::all_gather_v:
      return Algorithm::ring;
    case CollectiveOp::all_to_all:
    case CollectiveOp::all_to_all_v:
      return Algorithm::pairwise;
    case CollectiveOp::broadcast:
    case CollectiveOp::reduce:
    case CollectiveOp::barrier:
    case CollectiveOp::split:
      return Algorithm::tree;
  }
  return Algorithm::ring;
}

}  // namespace lattice::comm
