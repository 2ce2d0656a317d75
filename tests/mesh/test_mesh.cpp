// Mesh: layout resolution (dp inference, one-line errors for layouts that do not divide), rank
// order against a brute-force enumeration, and every group's members and allreduce on 1, 2, 4 and 8
// local ranks for every valid layout and every split of dp into dp_replicate x dp_shard.
#include <gtest/gtest.h>

#include <string>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/mesh/mesh.hpp"
#include "mesh_reference.hpp"

namespace lattice::mesh {
namespace {

std::string resolve_error(MeshShape requested, int world) {
  try {
    resolve_layout(requested, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ResolveLayout, InfersDataParallelFromWorldSize) {
  EXPECT_EQ(resolve_layout({.dp = -1}, 8), (MeshShape{1, 8, 1, 1, 1}));
  EXPECT_EQ(resolve_layout({.pp = 2, .dp = -1, .tp = 2}, 8), (MeshShape{2, 2, 1, 2, 1}));
  EXPECT_EQ(resolve_layout({.pp = 1, .dp = -1, .cp = 2, .tp = 1, .ep = 4}, 8),
            (MeshShape{1, 4, 2, 1, 4}));
  EXPECT_EQ(resolve_layout({.dp = -1, .tp = 4}, 4), (MeshShape{1, 1, 1, 4, 1}));
  EXPECT_EQ(resolve_layout({.pp = 2, .dp = 3, .tp = 2}, 12), (MeshShape{2, 3, 1, 2, 1}));
}

TEST(ResolveLayout, RefusesLayoutsThatDoNotDivideWithOneLine) {
  EXPECT_EQ(resolve_error({.dp = -1, .tp = 4}, 6),
            "parallelism: world size 6 is not divisible by pp x cp x tp = 4 (pp 1, cp 1, tp 4); "
            "choose pp, cp and tp whose product divides 6, or run on a multiple of 4 ranks");
  EXPECT_EQ(resolve_error({.dp = 4, .tp = 2}, 4),
            "parallelism: pp x dp x cp x tp = 8 (pp 1, dp 4, cp 1, tp 2) does not equal the world "
            "size 4; change the sizes so their product is 4, or set dp = -1 to infer it");
  EXPECT_EQ(resolve_error({.dp = 2, .cp = 2, .ep = 3}, 4),
            "parallelism: ep 3 does not divide dp x cp = 4 (dp 2, cp 2); choose an ep that "
            "divides 4");
  EXPECT_EQ(resolve_error({.dp = -1, .ep = 16}, 8),
            "parallelism: ep 16 does not divide dp x cp = 8 (dp 8, cp 1); choose an ep that "
            "divides 8");
  EXPECT_EQ(resolve_error({.pp = 0}, 4),
            "parallelism: pp = 0 is not a positive size; set [parallelism] pp (--pp) to 1 or more");
  EXPECT_EQ(
      resolve_error({.tp = -2}, 4),
      "parallelism: tp = -2 is not a positive size; set [parallelism] tp (--tp) to 1 or more");
  EXPECT_EQ(resolve_error({.dp = 0}, 4),
            "parallelism: dp = 0 is not a positive size; set [parallelism] dp (--dp) to 1 or "
            "more, or to -1 to infer it from the world size");
  EXPECT_EQ(resolve_error({}, 0),
            "parallelism: world size 0 is not positive; start at least one rank (--ranks or "
            "mpirun -n)");
  for (const std::string& message :
       {resolve_error({.dp = -1, .tp = 4}, 6), resolve_error({.dp = 3}, 4)}) {
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

TEST(ResolveLayout, EveryEnumeratedLayoutResolvesToItself) {
  for (int world : {1, 2, 3, 4, 6, 8, 12}) {
    for (const MeshShape& shape : testing::all_layouts(world)) {
      EXPECT_EQ(resolve_layout(shape, world), shape) << describe(shape);
      MeshShape inferred = shape;
      inferred.dp = -1;
      EXPECT_EQ(resolve_layout(inferred, world), shape) << describe(shape);
    }
  }
  EXPECT_EQ(testing::all_layouts(8).size(), 50u);  // 20 (pp,dp,cp,tp) factorizations x their eps
}

TEST(MeshCoordinates, RankOrderIsTpCpEpDpPp) {
  MeshShape shape{2, 2, 2, 2, 4};
  // tp innermost, then cp, then dp, then pp.
  EXPECT_EQ(rank_of(shape, {0, 0, 0, 1}), 1);
  EXPECT_EQ(rank_of(shape, {0, 0, 1, 0}), 2);
  EXPECT_EQ(rank_of(shape, {0, 1, 0, 0}), 4);
  EXPECT_EQ(rank_of(shape, {1, 0, 0, 0}), 8);
  EXPECT_EQ(coordinate_of(shape, 13), (MeshCoordinate{1, 1, 0, 1}));
  // ep takes the batch positions (cp fastest, then dp) in groups of 4: ranks 0, 2, 4, 6 of tp 0.
  EXPECT_EQ(expert_parallel_index(shape, coordinate_of(shape, 6)), 3);
  EXPECT_EQ(expert_data_parallel_index(shape, coordinate_of(shape, 6)), 0);
  EXPECT_THROW(rank_of(shape, {0, 2, 0, 0}), Error);
  EXPECT_THROW(coordinate_of(shape, 16), Error);
}

class MeshOnLocalRanks : public ::testing::TestWithParam<int> {};

TEST_P(MeshOnLocalRanks, EveryLayoutHasTheReferenceGroups) {
  const int world = GetParam();
  for (const MeshShape& shape : testing::all_layouts(world)) {
    // Every split of dp into dp_replicate x dp_shard (dp_shard = dp first: the default, 0).
    for (int dp_shard : testing::dp_shard_sizes(shape)) {
      comm::run_local_ranks(world, [&](comm::Communicator& comm) {
        Mesh mesh(comm, shape, dp_shard == shape.dp ? 0 : dp_shard);
        EXPECT_EQ(mesh.shape(), shape);
        EXPECT_EQ(mesh.size(Axis::dp_shard), dp_shard);
        EXPECT_EQ(mesh.size(Axis::dp_replicate), shape.dp / dp_shard);
        for (const std::string& failure : testing::check_mesh(mesh)) ADD_FAILURE() << failure;
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(World, MeshOnLocalRanks, ::testing::Values(1, 2, 4, 8));

TEST(Mesh, InfersDataParallelAndDescribesItself) {
  comm::run_local_ranks(4, [](comm::Communicator& comm) {
    Mesh mesh(comm, {.dp = -1, .tp = 2});
    EXPECT_EQ(mesh.size(Axis::dp), 2);
    EXPECT_EQ(mesh.describe(), "pp 1 x dp 2 x cp 1 x tp 2 (ep 1)");
    if (comm.rank() == 3) {
      EXPECT_EQ(mesh.describe_rank(), "rank 3 of 4: pp 0, dp 1, cp 0, tp 1 (ep 0, expert dp 1)");
    }
    EXPECT_EQ(&mesh.world(), &comm);
  });
}

TEST(Mesh, DataParallelSubAxesForHybridSharding) {
  // dp 4 as 2 replicas x 2 shards (tp 2 innermost): the ranks that shard are consecutive dp ranks.
  comm::run_local_ranks(8, [](comm::Communicator& comm) {
    Mesh mesh(comm, {.dp = 4, .tp = 2}, 2);
    EXPECT_EQ(mesh.describe(), "pp 1 x dp 4 x cp 1 x tp 2 (ep 1) (dp_replicate 2 x dp_shard 2)");
    if (comm.rank() == 5) {  // tp 1, dp 2: shard 0 of replica 1
      EXPECT_EQ(mesh.coordinate(Axis::dp), 2);
      EXPECT_EQ(mesh.coordinate(Axis::dp_shard), 0);
      EXPECT_EQ(mesh.coordinate(Axis::dp_replicate), 1);
    }
    int32_t shard_peer = comm.rank(), replica_peer = comm.rank();
    std::vector<int32_t> shard(2), replicas(2);
    mesh.group(Axis::dp_shard).all_gather(&shard_peer, shard.data(), 1, DType::i32);
    mesh.group(Axis::dp_replicate).all_gather(&replica_peer, replicas.data(), 1, DType::i32);
    if (comm.rank() == 5) {
      EXPECT_EQ(shard, (std::vector<int32_t>{5, 7}));
      EXPECT_EQ(replicas, (std::vector<int32_t>{1, 5}));
    }
    EXPECT_EQ(mesh.dp_shard_cp().size(), 2);
    EXPECT_EQ(mesh.dp_cp().size(), 4);
  });
}

TEST(Mesh, RefusesADpShardThatDoesNotDivideDp) {
  try {
    comm::run_local_ranks(4, [](comm::Communicator& comm) { Mesh mesh(comm, {.dp = 4}, 3); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "parallelism.hsdp_shard_size = 3 does not divide dp = 4: choose a divisor of dp (0 "
              "shards over every dp rank)");
  }
}

TEST(Mesh, RefusesALayoutThatDoesNotFitTheWorld) {
  try {
    comm::run_local_ranks(2, [](comm::Communicator& comm) { Mesh mesh(comm, {.tp = 4}); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not equal the world size 2"), std::string::npos)
        << e.what();
  }
}

TEST(Mesh, RefusesRanksThatDisagreeOnTheLayout) {
  try {
    comm::run_local_ranks(4, [](comm::Communicator& comm) {
      Mesh mesh(comm, comm.rank() == 2 ? MeshShape{.dp = 4} : MeshShape{.dp = 2, .tp = 2});
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mesh: ranks disagree on the layout (rank "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("give every rank the same [parallelism] settings"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lattice::mesh
