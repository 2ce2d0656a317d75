// Launch detection from environment variables.
#include "lattice/comm/launch.hpp"

#include <cstdlib>
#include <optional>

#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

class Environment {
 public:
  explicit Environment(const std::function<const char*(const char*)>& lookup) : lookup_(lookup) {}
  bool has(const char* name) const {
    const char* value = lookup_(name);
    return value && *value;
  }
  std::optional<int> integer(const char* name) const {
    const char* value = lookup_(name);
    if (!value || !*value) return std::nullopt;
    char* end = nullptr;
    long parsed = std::strtol(value, &end, 10);
    if (*end != '\0' || parsed < 0 || parsed > 1 << 30) {
      throw Error(std::string("launch environment: ") + name + "='" + value +
                  "' is not a non-negative integer");
    }
    return static_cast<int>(parsed);
  }

 private:
  const std::function<const char*(const char*)>& lookup_;
};

// Fills local_size / node / node_count from what is known, deriving the node from block placement
// when the launcher does not say.
void complete(LaunchInfo& info, std::optional<int> node, std::optional<int> node_count) {
  if (info.local_size < 1) info.local_size = 1;
  if (node && node_count) {
    info.node = *node;
    info.node_count = *node_count;
    info.node_from_launcher = true;
  } else {
    info.node = node ? *node : info.rank / info.local_size;
    info.node_count =
        node_count ? *node_count : (info.world_size + info.local_size - 1) / info.local_size;
    info.node_from_launcher = node.has_value();
  }
  if (info.rank >= info.world_size) {
    throw Error("launch environment (" + std::string(launcher_name(info.launcher)) + "): rank " +
                std::to_string(info.rank) + " is not below the world size " +
                std::to_string(info.world_size));
  }
}

}  // namespace

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "none";
    case Launcher::torchrun:
      return "torchrun";
    case Launcher::open_mpi:
      return "open_mpi";
    case Launcher::slurm:
      return "slurm";
    case Launcher::pmi:
      return "pmi";
    case Launcher::pmix:
      return "pmix";
  }
  return "?";
}

std::string LaunchInfo::describe() const {
  return std::string(launcher_name(launcher)) + ": rank " + std::to_string(rank) + " of " +
         std::to_string(world_size) + ", local rank " + std::to_string(local_rank) + " of " +
         std::to_string(local_size) + ", node " + std::to_string(node) + " of " +
         std::to_string(node_count);
}

LaunchInfo detect_launch(const std::function<const char*(const char*)>& lookup) {
  Environment env(lookup);
  LaunchInfo info;
  if (env.has("RANK") && env.has("WORLD_SIZE")) {
    info.launcher = Launcher::torchrun;
    info.rank = *env.integer("RANK");
    info.world_size = *env.integer("WORLD_SIZE");
    info.local_rank = env.integer("LOCAL_RANK").value_or(0);
    info.local_size = env.integer("LOCAL_WORLD_SIZE").value_or(info.world_size);
    std::optional<int> node = env.integer("GROUP_RANK");
    if (!node) node = env.integer("NODE_RANK");
    std::optional<int> nodes = env.integer("GROUP_WORLD_SIZE");
    if (!nodes) nodes = env.integer("NNODES");
    complete(info, node, nodes);
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    info.launcher = Launcher::open_mpi;
    info.rank = *env.integer("OMPI_COMM_WORLD_RANK");
    info.world_size = env.integer("OMPI_COMM_WORLD_SIZE").value_or(1);
    info.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    info.local_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(info.world_size);
    complete(info, std::nullopt, std::nullopt);
  } else if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS")) {
    info.launcher = Launcher::slurm;
    info.rank = *env.integer("SLURM_PROCID");
    info.world_size = *env.integer("SLURM_NTASKS");
    info.local_rank = env.integer("SLURM_LOCALID").value_or(0);
    std::optional<int> nodes = env.integer("SLURM_NNODES");
    std::optional<int> per_node = env.integer("SLURM_NTASKS_PER_NODE");
    info.local_size = per_node.value_or(nodes ? (info.world_size + *nodes - 1) / *nodes : 1);
    complete(info, env.integer("SLURM_NODEID"), nodes);
  } else if (env.has("PMI_RANK")) {
    info.launcher = Launcher::pmi;
    info.rank = *env.integer("PMI_RANK");
    info.world_size = env.integer("PMI_SIZE").value_or(1);
    info.local_rank = env.integer("MPI_LOCALRANKID").value_or(0);
    info.local_size = env.integer("MPI_LOCALNRANKS").value_or(info.world_size);
    complete(info, std::nullopt, std::nullopt);
  } else if (env.has("PMIX_RANK")) {
    info.launcher = Launcher::pmix;
    info.rank = *env.integer("PMIX_RANK");
    // PMIx publishes the size through its API, not the environment; Open MPI and Slurm variables
    // (checked above) usually accompany it.
    info.world_size = std::max(info.rank + 1, env.integer("PMIX_SIZE").value_or(info.rank + 1));
    info.local_rank = env.integer("PMIX_LOCAL_RANK").value_or(0);
    info.local_size = env.integer("PMIX_LOCAL_SIZE").value_or(info.world_size);
    complete(info, std::nullopt, std::nullopt);
  }
  return info;
}

LaunchInfo detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace lattice::comm
