// BucketLayout and the global gradient norm: buckets tile the flat buffer in backward order at
// unit boundaries, shards are padded (never dropped), boundaries do not depend on the rank count,
// and the norm computed from shards on N ranks is bit-identical to one rank's and agrees with a
// plain double sum.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/parallel/bucket_layout.hpp"
#include "lattice/parallel/global_norm.hpp"

using namespace lattice;
using lattice::parallel::BucketLayout;
using lattice::parallel::kNormChunk;

namespace {

model::ModelConfig small_model() {
  model::ModelConfig c = model::model_preset("gpt2-tiny");
  c.n_layers = 4;
  return c;
}

}  // namespace

TEST(BucketLayout, TilesTheBufferInBackwardOrderAtUnitBoundaries) {
  model::Transformer model(small_model(), nullptr);
  const auto& units = model.units();
  ASSERT_EQ(units.size(), 6u);  // embedding, 4 blocks, head
  for (int ranks : {1, 2, 3, 4}) {
    BucketLayout layout(units, 10000, ranks);
    int64_t expected_end = model.parameters().size();
    int64_t shard_total = 0;
    for (const auto& b : layout.buckets()) {
      EXPECT_EQ(b.end, expected_end) << "buckets must be contiguous, highest offsets first";
      EXPECT_EQ(b.begin, units[static_cast<size_t>(b.first_unit)].begin);
      EXPECT_EQ(b.end, units[static_cast<size_t>(b.last_unit)].end);
      EXPECT_EQ(b.shard % kNormChunk, 0);
      EXPECT_GE(b.shard * ranks, b.size()) << "padding, never dropping";
      EXPECT_LT(b.shard * ranks - b.size(), int64_t{ranks} * kNormChunk);
      EXPECT_EQ(b.shard_offset, shard_total);
      shard_total += b.shard;
      expected_end = b.begin;
    }
    EXPECT_EQ(expected_end, 0);
    EXPECT_EQ(layout.shard_elements(), shard_total);
    // Boundaries depend on the bucket size only, not on the rank count.
    BucketLayout one(units, 10000, 1);
    ASSERT_EQ(one.buckets().size(), layout.buckets().size());
    for (size_t i = 0; i < one.buckets().size(); ++i)
      EXPECT_EQ(one.buckets()[i].begin, layout.buckets()[i].begin);
  }
  // The head comes first and the embedding last, each alone in its bucket however large buckets
  // are.
  const BucketLayout large(units, int64_t{1} << 30, 2);
  ASSERT_EQ(large.buckets().size(), 3u);
  EXPECT_TRUE(large.buckets().front().outer);
  EXPECT_EQ(large.buckets().front().first_unit, 5);
  EXPECT_FALSE(large.buckets()[1].outer);
  EXPECT_EQ(large.buckets()[1].first_unit, 1);
  EXPECT_EQ(large.buckets()[1].last_unit, 4);
  EXPECT_TRUE(large.buckets().back().outer);
  EXPECT_EQ(large.buckets().back().last_unit, 0);
}

TEST(BucketLayout, InvalidSizesAreRefused) {
  model::Transformer model(small_model(), nullptr);
  EXPECT_THROW(BucketLayout(model.units(), 0, 2), Error);
  EXPECT_THROW(BucketLayout(model.units(), 1000, 0), Error);
}

TEST(GlobalNorm, ShardedOnAnyRankCountEqualsOneRankBitForBit) {
  model::Transformer model(small_model(), nullptr);
  const int64_t n = model.parameters().size();
  std::vector<float> grads(static_cast<size_t>(n));
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  for (auto& g : grads) g = normal(gen);
  // Independent reference: a plain double sum of squares.
  double reference = 0;
  for (float g : grads) reference += static_cast<double>(g) * g;
  reference = std::sqrt(reference);

  const BucketLayout one(model.units(), 5000, 1);
  kernels::CpuOps norm_ops;
  const double single = parallel::replicated_gradient_norm(norm_ops, one, grads.data());
  EXPECT_NEAR(single, reference, 1e-12 * reference);  // only the addition order differs
  for (int ranks : {2, 3, 4}) {
    const BucketLayout layout(model.units(), 5000, ranks);
    EXPECT_EQ(parallel::replicated_gradient_norm(norm_ops, layout, grads.data()), single);
    std::vector<double> norms(static_cast<size_t>(ranks));
    comm::run_local_ranks(ranks, [&](comm::Communicator& group) {
      // This rank's shard buffer, as ZeRO holds it after the reduce-scatter.
      std::vector<float> shard(static_cast<size_t>(layout.shard_elements()), 0.0f);
      for (const auto& b : layout.buckets())
        for (int64_t i = b.shard_begin(group.rank()); i < b.shard_end(group.rank()); ++i)
          shard[static_cast<size_t>(b.shard_offset + i - b.begin - b.shard * group.rank())] =
              grads[static_cast<size_t>(i)];
      kernels::CpuOps rank_ops;  // one backend per rank
      norms[static_cast<size_t>(group.rank())] =
          parallel::sharded_gradient_norm(rank_ops, layout, shard.data(), group);
    });
    for (double norm : norms) EXPECT_EQ(norm, single) << ranks << " ranks";
  }
}
