// The global gradient norm reads placements: with a hand-sharded store on two tensor-parallel
// "ranks" (threads on the local backend) holding one parameter split in halves along dimension 0,
// one split along dimension 1 and one replicated, the norm counts each logical element once and
// equals the norm of the unsharded store on one rank; composed with ZeRO's data-parallel shards
// (dp 2 x tp 2 on four ranks) it is bit-identical to tp 2 alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/global_norm.hpp"

using namespace lattice;
using lattice::model::ParameterStore;
using lattice::model::TensorShard;

namespace {

// The logical parameters: "split0" [64, 48] sharded in halves along dimension 0, "split1" [10, 40]
// sharded along dimension 1, "replicated" [300] whole on every rank. Sizes that are not multiples
// of the norm's 1024-element chunks, so chunks straddle parameters of different placements.
const Shape kSplit0{64, 48}, kSplit1{10, 40}, kReplicated{300};

// The store of tensor-parallel rank `rank` of `ranks` (ranks = 1: the unsharded model). With
// `mislabel_replicated`, the replicated parameter is declared as if each rank held other elements
// (the mistake the placement exists to prevent: it would be counted `ranks` times).
ParameterStore make_store(int rank, int ranks, bool mislabel_replicated = false) {
  ParameterStore store;
  const mesh::AxisSet not_tp = mesh::AxisSet::all().without(mesh::Axis::tp);
  store.declare_shard("split0", kSplit0, TensorShard{0, rank, ranks}, not_tp,
                      model::InitKind::normal, true);
  store.declare_shard("replicated", kReplicated, TensorShard{},
                      mislabel_replicated ? not_tp : mesh::AxisSet::all(), model::InitKind::zeros,
                      false);
  store.declare_shard("split1", kSplit1, TensorShard{1, rank, ranks}, not_tp,
                      model::InitKind::normal, true);
  store.allocate(nullptr);
  return store;
}

// The logical gradients, by parameter name order (split0, replicated, split1), row-major.
struct LogicalGradients {
  std::vector<float> split0, replicated, split1;
};

LogicalGradients make_gradients(bool exact) {
  LogicalGradients g;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  int k = 0;
  // Exact: small multiples of 1/8, whose squares and sums are exact in double, so every addition
  // order gives the same bits and equality tests the counting alone.
  auto next = [&] { return exact ? static_cast<float>(++k % 13 - 6) / 8.0f : normal(gen); };
  for (std::vector<float>* v : {&g.split0, &g.replicated, &g.split1}) {
    const Shape& shape = v == &g.split0 ? kSplit0 : v == &g.replicated ? kReplicated : kSplit1;
    v->resize(static_cast<size_t>(shape_numel(shape)));
    for (float& x : *v) x = next();
  }
  return g;
}

// Copies rank `rank`'s slices of the logical gradients into `store`'s gradient buffer.
void fill_gradients(ParameterStore& store, const LogicalGradients& g, int rank, int ranks) {
  store.zero_grads();
  const int64_t rows0 = kSplit0[0] / ranks;
  std::copy(g.split0.begin() + rank * rows0 * kSplit0[1],
            g.split0.begin() + (rank + 1) * rows0 * kSplit0[1],
            store.grad(store.index_of("split0")));
  std::copy(g.replicated.begin(), g.replicated.end(), store.grad(store.index_of("replicated")));
  const int64_t cols1 = kSplit1[1] / ranks;
  float* split1 = store.grad(store.index_of("split1"));
  for (int64_t r = 0; r < kSplit1[0]; ++r)
    for (int64_t c = 0; c < cols1; ++c)
      split1[r * cols1 + c] = g.split1[static_cast<size_t>(r * kSplit1[1] + rank * cols1 + c)];
}

// One unit covering the whole store (the norm's chunks do not depend on units beyond buckets).
std::vector<model::ParameterUnit> whole_store(const ParameterStore& store) {
  return {model::ParameterUnit{0, store.size(), false}};
}

double plain_norm(const LogicalGradients& g) {
  double sum = 0;
  for (const std::vector<float>* v : {&g.split0, &g.replicated, &g.split1})
    for (float x : *v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

// The unsharded store's norm on one rank.
double unsharded_norm(const LogicalGradients& g) {
  ParameterStore store = make_store(0, 1);
  fill_gradients(store, g, 0, 1);
  const parallel::BucketLayout layout(whole_store(store), 1 << 20, 1);
  kernels::CpuOps norm_ops;
  return parallel::replicated_gradient_norm(norm_ops, layout, store.grads());
}

// The norm on two tensor-parallel ranks (every rank's result).
std::vector<double> tensor_parallel_norms(const LogicalGradients& g, bool mislabel = false) {
  std::vector<double> norms(2);
  comm::run_local_ranks(2, [&](comm::Communicator& world) {
    mesh::Mesh mesh(world, {.tp = 2});
    ParameterStore store = make_store(mesh.coordinate(mesh::Axis::tp), 2, mislabel);
    fill_gradients(store, g, mesh.coordinate(mesh::Axis::tp), 2);
    const parallel::BucketLayout layout(whole_store(store), 1 << 20, 1);
    const mesh::AxisGroups groups = mesh.axis_groups();
    const parallel::NormClasses classes(store, groups);
    EXPECT_EQ(classes.count(), mislabel ? 1 : 2);
    kernels::CpuOps norm_ops;
    norms[static_cast<size_t>(world.rank())] =
        parallel::replicated_gradient_norm(norm_ops, layout, store.grads(), classes, groups);
  });
  return norms;
}

}  // namespace

TEST(PlacedGradientNorm, CountsEachLogicalElementOnceWithExactValues) {
  // Exactly representable sums: the sharded norm must equal the unsharded one bit for bit, and
  // counting the replicated parameter on both ranks must change it.
  const LogicalGradients g = make_gradients(true);
  const double reference = plain_norm(g);
  EXPECT_EQ(unsharded_norm(g), reference);
  for (double norm : tensor_parallel_norms(g)) EXPECT_EQ(norm, reference);
  double twice = 0;  // the replicated parameter counted on both ranks
  for (const std::vector<float>* v : {&g.split0, &g.replicated, &g.replicated, &g.split1})
    for (float x : *v) twice += static_cast<double>(x) * x;
  for (double norm : tensor_parallel_norms(g, true)) {
    EXPECT_NE(norm, reference);
    EXPECT_EQ(norm, std::sqrt(twice));
  }
}

TEST(PlacedGradientNorm, EqualsTheUnshardedNormWithinDoubleRounding) {
  // Random fp32 gradients: every square is the same double on both sides; only the grouping of
  // the ~1e4 additions differs (per class and per rank, and chunks no longer straddle two
  // placements), each addition off by at most 2^-53 relative, so 1e-12 relative bounds it.
  const LogicalGradients g = make_gradients(false);
  const double reference = unsharded_norm(g);
  EXPECT_NEAR(reference, plain_norm(g), 1e-12 * reference);
  const std::vector<double> norms = tensor_parallel_norms(g);
  EXPECT_EQ(norms[0], norms[1]);  // every rank adds in the same order
  EXPECT_NEAR(norms[0], reference, 1e-12 * reference);
}

TEST(PlacedGradientNorm, ZeroShardsTimesTensorShardsEqualTensorShardsAloneBitForBit) {
  // dp 2 x tp 2 on four ranks: each dp rank holds its ZeRO shard of every bucket of its tp
  // slice's reduced gradients; the chunk sums are those of tp 2 alone, added in the same order.
  const LogicalGradients g = make_gradients(false);
  const double tp_only = tensor_parallel_norms(g)[0];
  std::vector<double> norms(4);
  comm::run_local_ranks(4, [&](comm::Communicator& world) {
    mesh::Mesh mesh(world, {.dp = 2, .tp = 2});
    const int tp = mesh.coordinate(mesh::Axis::tp);
    ParameterStore store = make_store(tp, 2);
    fill_gradients(store, g, tp, 2);
    comm::Communicator& dp = mesh.dp_shard_cp();
    const parallel::BucketLayout layout(whole_store(store), 1 << 20, dp.size());
    std::vector<float> shard(static_cast<size_t>(layout.shard_elements()), 0.0f);
    for (const auto& b : layout.buckets())
      for (int64_t i = b.shard_begin(dp.rank()); i < b.shard_end(dp.rank()); ++i)
        shard[static_cast<size_t>(b.shard_offset + i - b.begin - b.shard * dp.rank())] =
            store.grads()[i];
    const mesh::AxisGroups groups = mesh.axis_groups();
    kernels::CpuOps norm_ops;
    norms[static_cast<size_t>(world.rank())] = parallel::sharded_gradient_norm(
        norm_ops, layout, shard.data(), dp, parallel::NormClasses(store, groups), groups);
  });
  for (double norm : norms) EXPECT_EQ(norm, tp_only);
}

TEST(PlacedGradientNorm, OneClassIsThePlainChunkedSum) {
  // Without tensor parallelism (tp 1) every parameter is in one class whatever its placement,
  // and the norm is the one-class sum exactly (the bits of every run without tp).
  const LogicalGradients g = make_gradients(false);
  ParameterStore store = make_store(0, 1);
  fill_gradients(store, g, 0, 1);
  const parallel::BucketLayout layout(whole_store(store), 1 << 20, 1);
  comm::run_local_ranks(1, [&](comm::Communicator& world) {
    mesh::Mesh mesh(world, {});
    const mesh::AxisGroups groups = mesh.axis_groups();
    const parallel::NormClasses classes(store, groups);
    EXPECT_EQ(classes.count(), 1);
    EXPECT_TRUE(classes.runs().empty());
    kernels::CpuOps norm_ops;
    EXPECT_EQ(parallel::replicated_gradient_norm(norm_ops, layout, store.grads(), classes, groups),
              parallel::replicated_gradient_norm(norm_ops, layout, store.grads()));
  });
}
