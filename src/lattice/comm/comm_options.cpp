// Environment overrides of CommOptions.
#include "lattice/comm/comm_options.hpp"

#include <cstdlib>
#include <string>
#include <string_view>

#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

int64_t parse_integer(const char* name, const char* text) {
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0)
    throw Error(std::string(name) + "='" + text + "' is not a non-negative integer");
  return value;
}

CollectiveOp parse_op(std::string_view name) {
  for (int i = 0; i < kCollectiveOpCount; ++i) {
    auto op = static_cast<CollectiveOp>(i);
    if (collective_op_name(op) == name) return op;
  }
  throw Error("LATTICE_COMM_ALGORITHM names unknown collective '" + std::string(name) +
              "'; use allreduce, reduce_scatter, all_gather, all_to_all, broadcast, reduce, ...");
}

}  // namespace

CommOptions options_from_environment(CommOptions options) {
  if (const char* text = std::getenv("LATTICE_COMM_TIMEOUT_MS"))
    options.timeout = std::chrono::milliseconds(parse_integer("LATTICE_COMM_TIMEOUT_MS", text));
  if (const char* text = std::getenv("LATTICE_COMM_VERIFY"))
    options.verify_collectives = parse_integer("LATTICE_COMM_VERIFY", text) != 0;
  if (const char* text = std::getenv("LATTICE_COMM_RANKS_PER_NODE"))
    options.ranks_per_node = static_cast<int>(parse_integer("LATTICE_COMM_RANKS_PER_NODE", text));
  if (const char* text = std::getenv("LATTICE_COMM_ALGORITHM")) {
    std::string_view spec(text);
    while (!spec.empty()) {
      size_t comma = spec.find(',');
      std::string_view item = spec.substr(0, comma);
      spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
      size_t equals = item.find('=');
      if (equals == std::string_view::npos) {
        Algorithm algorithm = parse_algorithm(item);
        for (int i = 0; i < kCollectiveOpCount; ++i) {
          auto op = static_cast<CollectiveOp>(i);
          if (algorithm_supports(algorithm, op)) options.force(op, algorithm);
        }
      } else {
        options.force(parse_op(item.substr(0, equals)), parse_algorithm(item.substr(equals + 1)));
      }
    }
  }
  return options;
}

}  // namespace lattice::comm
