// MeshShape: the sizes of the parallel axes (pp, dp, cp, tp, with ep carved out of dp x cp) and the
// checks that turn a requested layout into one that fits the world size and the model, refusing
// anything that does not divide with one line that names the keys and what to change.
#pragma once

#include <string>

namespace lattice::mesh {

// Sizes of the parallel axes. The world is pp x dp x cp x tp ranks; ep does not multiply the world:
// the dp x cp ranks of one (pp, tp) position are regrouped into ep expert-parallel groups.
struct MeshShape {
  int pp = 1;
  int dp = 1;  // -1 in a request: inferred from the world size
  int cp = 1;
  int tp = 1;
  int ep = 1;

  int world() const { return pp * dp * cp * tp; }
  // dp x cp: the ranks that see different data (the batch group's size).
  int batch_parallel() const { return dp * cp; }
  // The expert-data-parallel size: dp x cp / ep.
  int expert_data_parallel() const { return dp * cp / ep; }

  bool operator==(const MeshShape&) const = default;
};

// Resolves a requested layout against the world size: dp = -1 becomes world / (pp x cp x tp); every
// other size must be positive and the product must equal the world size; ep must divide dp x cp.
// Throws lattice::Error with one line naming the keys ([parallelism] pp/dp/cp/tp/ep) and the fix.
MeshShape resolve_layout(MeshShape requested, int world_size);

// "pp 1 x dp 2 x cp 1 x tp 2 (ep 1)".
std::string describe(const MeshShape& shape);

}  // namespace lattice::mesh
