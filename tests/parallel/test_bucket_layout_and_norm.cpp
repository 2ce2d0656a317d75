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

TEST(BucketLayout, ExpertParallelExpertsGetBucketsOfTheirOwn) {
  // mixtral-tiny with 4 layers on expert-parallel rank 1 of 2: every block's two local experts are
  // laid out after all dense parameters, and get buckets of their own, sharded over the expert
  // group (3 ranks here, the dense buckets over 4).
  model::ModelConfig config = model::model_preset("mixtral-tiny");
  config.n_layers = 4;
  const auto model =
      model::Transformer::declared_only(config, {}, {}, model::ExpertParallelGroup{nullptr, 1, 2});
  const model::ParameterStore& store = model->parameters();
  const auto& units = model->units();
  ASSERT_EQ(units.size(), 6u);
  // Placements decide the region: experts (held along ep alone) past trailing_offset, the rest
  // before it; the units' ranges tile each region in forward order.
  for (const auto& p : store.parameters())
    EXPECT_EQ(p.offset >= store.trailing_offset(), !p.replicated.contains(mesh::Axis::ep))
        << p.name;
  int64_t dense = 0, experts = store.trailing_offset();
  for (size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(units[u].begin, dense);
    EXPECT_EQ(units[u].expert_begin, experts);
    EXPECT_EQ(units[u].has_experts(), u >= 1 && u <= 4) << "unit " << u;
    dense = units[u].end;
    experts = units[u].expert_end;
  }
  EXPECT_EQ(dense, store.trailing_offset());
  EXPECT_EQ(experts, store.size());

  const BucketLayout layout(units, 5000, 4, 3);
  int64_t expected_end = store.trailing_offset(), shard_total = 0;
  bool experts_seen = false;
  for (const auto& b : layout.buckets()) {
    if (b.expert && !experts_seen) {  // the expert buckets follow the dense ones
      EXPECT_EQ(expected_end, 0) << "every dense bucket comes first";
      EXPECT_EQ(layout.dense_shard_elements(), shard_total);
      expected_end = store.size();
      experts_seen = true;
    }
    EXPECT_EQ(b.expert, experts_seen);
    EXPECT_EQ(b.ranks, b.expert ? 3 : 4);
    EXPECT_EQ(b.end, expected_end) << "contiguous, highest offsets first";
    const auto& first = units[static_cast<size_t>(b.first_unit)];
    const auto& last = units[static_cast<size_t>(b.last_unit)];
    EXPECT_EQ(b.begin, b.expert ? first.expert_begin : first.begin);
    EXPECT_EQ(b.end, b.expert ? last.expert_end : last.end);
    EXPECT_GE(b.shard * b.ranks, b.size());
    EXPECT_EQ(b.shard_offset, shard_total);
    shard_total += b.shard;
    expected_end = b.begin;
  }
  ASSERT_TRUE(experts_seen);
  EXPECT_EQ(expected_end, store.trailing_offset());
  EXPECT_EQ(layout.shard_elements(), shard_total);
  // Each block is in one dense and one expert bucket; the embedding and head in a dense one only.
  for (int u = 0; u < 6; ++u) {
    EXPECT_FALSE(layout.buckets()[static_cast<size_t>(layout.bucket_of_unit(u))].expert);
    const int e = layout.expert_bucket_of_unit(u);
    EXPECT_EQ(e >= 0, u >= 1 && u <= 4) << "unit " << u;
    if (e >= 0) EXPECT_TRUE(layout.buckets()[static_cast<size_t>(e)].expert);
  }
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
