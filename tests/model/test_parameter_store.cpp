// Tests of the ParameterStore's bf16 copies: off until asked for, then each parameter's copy is
// lattice::to_bf16 of its values, rounded again after a write through mutable_values and not on
// reads, taken as written by an optimizer's pass, tracked as parameter memory; and a bf16 model
// reading them gives the losses and gradients of one that rounds its weights at every use.
// And of placements: a declared parameter is whole and replicated over every mesh axis, a declared
// shard records its logical shape, slice and axes, and initialises to exactly its slice of the
// whole parameter's values.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;

namespace {

// Every element of parameter `index`'s copy equal to the rounding of its value.
void expect_copy_is_rounded(ParameterStore& store, int index) {
  const lattice::bf16* copy = store.bf16_value(index);
  ASSERT_NE(copy, nullptr);
  const float* value = store.value(index);
  for (int64_t i = 0; i < store.info(index).numel; ++i)
    ASSERT_EQ(copy[i].bits, lattice::to_bf16(value[i]).bits)
        << store.info(index).name << " element " << i;
}

}  // namespace

TEST(ParameterStoreBf16Copies, AreTheRoundedValuesAndFollowEveryWrite) {
  ParameterStore store;
  const int matrix = store.declare("w", {40, 33}, InitKind::normal, true);
  const int bias = store.declare("b", {7}, InitKind::zeros, false);
  MemoryTracker tracker;
  store.allocate(&tracker);
  store.initialize(3, 0.5f, 1);
  EXPECT_FALSE(store.keeps_bf16_copies());
  EXPECT_EQ(store.bf16_value(matrix), nullptr);  // not kept: callers round the fp32 values
  EXPECT_EQ(store.bf16_copies_for_writing(), nullptr);
  const int64_t before = tracker.current(MemoryCategory::parameters);
  store.keep_bf16_copies(&tracker);
  EXPECT_TRUE(store.keeps_bf16_copies());
  EXPECT_EQ(tracker.current(MemoryCategory::parameters) - before, 2 * store.size());
  expect_copy_is_rounded(store, matrix);
  expect_copy_is_rounded(store, bias);

  // A write through mutable_value: the next copy is rounded from the new values.
  store.mutable_value(matrix)[5] = 3.0f;
  store.mutable_value(bias)[0] = -1e-39f;  // a denormal: rounded, not flushed
  expect_copy_is_rounded(store, matrix);
  expect_copy_is_rounded(store, bias);
  EXPECT_EQ(store.bf16_value(matrix)[5].bits, lattice::to_bf16(3.0f).bits);

  // Reads do not round again: a value changed through a pointer taken before the copy was last
  // made (against the rule that a writer takes its pointer for each write) is not seen until the
  // next mutable_values call. This is what saves the rounding per use.
  float* early = store.mutable_values() + store.info(matrix).offset;
  const uint16_t rounded_before = store.bf16_value(matrix)[0].bits;
  early[0] = 1234.0f;
  EXPECT_EQ(store.bf16_value(matrix)[0].bits, rounded_before);
  store.mutable_values();
  EXPECT_EQ(store.bf16_value(matrix)[0].bits, lattice::to_bf16(1234.0f).bits);

  // An optimizer's pass: what it writes into the copies is taken as current (not rounded again)
  // until the values are next handed out for writing.
  float* values = store.mutable_values();
  lattice::bf16* copies = store.bf16_copies_for_writing();
  ASSERT_NE(copies, nullptr);
  for (int64_t i = 0; i < store.size(); ++i) {
    values[i] = 2.0f;
    copies[i] = lattice::to_bf16(2.0f);
  }
  copies[store.info(matrix).offset + 1].bits = 0x7777;  // a marker no rounding would write
  store.bf16_copies_written();
  EXPECT_EQ(store.bf16_value(matrix)[1].bits, 0x7777);
  store.mutable_values();
  expect_copy_is_rounded(store, matrix);
}

// A bf16 model reading its weights' bf16 copies against one that rounds them at every use: losses
// and every gradient bit-identical, over updates written through mutable_values (as an optimizer
// does) and through the copies' writing pass; both LM-head paths (256 rows take the vocabulary-
// blocked head where the width allows it, 24 rows the row-chunk head).
class Bf16CopiesParity : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16CopiesParity, ModelLossesAndGradientsAreBitIdentical) {
  ModelConfig config = model_preset(GetParam());
  config.init_std = 0.2f;
  kernels::CpuOps ops;
  const LayerContext ctx{ops, kernels::Precision::bf16, nullptr};
  for (const int64_t B : {int64_t{1}, int64_t{8}}) {
    const int64_t T = B == 1 ? 24 : 32;
    SCOPED_TRACE(::testing::Message() << GetParam() << ", " << B * T << " rows");
    Transformer copied(config, nullptr), rounding(config, nullptr);
    copied.initialize(5);
    rounding.initialize(5);
    copied.parameters().keep_bf16_copies(nullptr);
    Rng rng(11);
    std::vector<int32_t> tokens, targets;
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
      targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
    }
    for (int step = 0; step < 3; ++step) {
      float losses[2];
      int m = 0;
      for (Transformer* model : {&copied, &rounding}) {
        model->parameters().zero_grads();
        losses[m++] = model->forward(ctx, tokens.data(), targets.data(), B, T, 1.0f);
        model->backward(ctx);
      }
      EXPECT_EQ(losses[0], losses[1]) << "step " << step;
      const ParameterStore& a = copied.parameters();
      const ParameterStore& b = rounding.parameters();
      ASSERT_EQ(0, std::memcmp(a.grads(), b.grads(), static_cast<size_t>(a.size()) * 4))
          << "gradients differ at step " << step;
      // An update of every value: on odd steps through the copies' writing pass.
      for (Transformer* model : {&copied, &rounding}) {
        ParameterStore& store = model->parameters();
        float* values = store.mutable_values();
        for (int64_t i = 0; i < store.size(); ++i) values[i] -= 0.01f * store.grads()[i];
        if (lattice::bf16* copies = store.bf16_copies_for_writing(); copies && step % 2 == 1) {
          for (int64_t i = 0; i < store.size(); ++i) copies[i] = lattice::to_bf16(values[i]);
          store.bf16_copies_written();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Bf16CopiesParity, ::testing::Values("gpt2-tiny", "llama-tiny"));

TEST(ParameterPlacement, DeclaredParametersAreWholeAndReplicatedOverEveryAxis) {
  ParameterStore store;
  const int w = store.declare("w", {40, 33}, InitKind::normal, true);
  const ParameterInfo& p = store.info(w);
  EXPECT_EQ(p.global_shape, (Shape{40, 33}));
  EXPECT_EQ(p.shape, p.global_shape);
  EXPECT_TRUE(p.shard.whole());
  EXPECT_EQ(p.replicated, mesh::AxisSet::all());
  for (mesh::Axis axis : mesh::kAllAxes) EXPECT_TRUE(p.replicated.contains(axis));
}

TEST(ParameterPlacement, ADeclaredShardRecordsItsSliceAndAxes) {
  ParameterStore store;
  const mesh::AxisSet not_tp = mesh::AxisSet::all().without(mesh::Axis::tp);
  const int column = store.declare_shard("c", {64, 48}, {.dim = 0, .index = 1, .count = 2}, not_tp,
                                         InitKind::normal, true);
  const int row = store.declare_shard("r", {64, 48}, {.dim = 1, .index = 2, .count = 4}, not_tp,
                                      InitKind::normal, true);
  const int bias = store.declare("b", {7}, InitKind::zeros, false);
  EXPECT_EQ(store.info(column).shape, (Shape{32, 48}));
  EXPECT_EQ(store.info(column).numel, 32 * 48);
  EXPECT_EQ(store.info(column).global_shape, (Shape{64, 48}));
  EXPECT_EQ(store.info(column).shard, (TensorShard{0, 1, 2}));
  EXPECT_FALSE(store.info(column).replicated.contains(mesh::Axis::tp));
  EXPECT_TRUE(store.info(column).replicated.contains(mesh::Axis::dp));
  EXPECT_EQ(store.info(row).shape, (Shape{64, 12}));
  EXPECT_EQ(store.info(row).replicated.names(), "pp,dp,cp,ep,dp_replicate,dp_shard");
  // Offsets stay 16-element aligned and follow the local sizes.
  EXPECT_EQ(store.info(row).offset, 32 * 48);
  EXPECT_EQ(store.info(bias).offset, 32 * 48 + 64 * 12);
  // A count of 1 is the whole tensor whatever the dim and index given.
  const int whole = store.declare_shard("x", {5, 3}, {.dim = 1, .index = 0, .count = 1},
                                        mesh::AxisSet::all(), InitKind::ones, false);
  EXPECT_TRUE(store.info(whole).shard.whole());
  EXPECT_EQ(store.info(whole).shape, (Shape{5, 3}));
}

TEST(ParameterPlacement, ShardsThatAreNotSlicesAreRefused) {
  ParameterStore store;
  const mesh::AxisSet all = mesh::AxisSet::all();
  try {
    store.declare_shard("w", {10, 6}, {.dim = 0, .index = 0, .count = 4}, all, InitKind::normal,
                        true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "parameter 'w': dimension 0 (10) does not split into 4 equal shards: choose a size "
              "it divides");
  }
  EXPECT_THROW(store.declare_shard("w", {8}, {.dim = 1, .index = 0, .count = 2}, all,
                                   InitKind::normal, true),
               Error);
  EXPECT_THROW(store.declare_shard("w", {8}, {.dim = 0, .index = 2, .count = 2}, all,
                                   InitKind::normal, true),
               Error);
}

TEST(ParameterPlacement, AShardInitialisesToItsSliceOfTheWholeParameter) {
  // The whole parameters, initialised once; then every shard of every dimension, each in a store
  // of its own (with other parameters around it), must hold exactly its slice of them.
  const Shape shape{6, 8, 10};
  ParameterStore whole;
  whole.declare("first", {33}, InitKind::normal, true);
  const int w = whole.declare("w", shape, InitKind::normal, true);
  const int v = whole.declare("v", shape, InitKind::normal_residual, true);
  whole.allocate(nullptr);
  whole.initialize(11, 0.02f, 4);
  for (int dim = 0; dim < 3; ++dim) {
    for (int count : {2, 3, 5}) {
      if (shape[static_cast<size_t>(dim)] % count != 0) continue;
      for (int index = 0; index < count; ++index) {
        ParameterStore part;
        const TensorShard shard{dim, index, count};
        const int pw =
            part.declare_shard("w", shape, shard, mesh::AxisSet::all(), InitKind::normal, true);
        part.declare("between", {3}, InitKind::normal, true);
        const int pv = part.declare_shard("v", shape, shard, mesh::AxisSet::all(),
                                          InitKind::normal_residual, true);
        part.allocate(nullptr);
        part.initialize(11, 0.02f, 4);
        // The slice by its coordinates in the whole tensor.
        const Shape& local = part.info(pw).shape;
        for (int which = 0; which < 2; ++which) {
          const float* got = part.value(which == 0 ? pw : pv);
          const float* all = whole.value(which == 0 ? w : v);
          int64_t i = 0;
          for (int64_t a = 0; a < local[0]; ++a)
            for (int64_t b = 0; b < local[1]; ++b)
              for (int64_t c = 0; c < local[2]; ++c, ++i) {
                int64_t at[3] = {a, b, c};
                at[dim] += index * local[static_cast<size_t>(dim)];
                const float want = all[(at[0] * shape[1] + at[1]) * shape[2] + at[2]];
                ASSERT_EQ(got[i], want) << "dim " << dim << " shard " << index << "/" << count;
              }
        }
      }
    }
  }
}

TEST(ParameterPlacement, ABlockedShardHoldsItsSliceOfEveryBlock) {
  // A packed [q | k | v] projection [3·8, 4] split over 2 ranks by blocks: rank r holds rows
  // [4r, 4r + 4) of each 8-row block, in block order; the slice walk says the same.
  const Shape shape{24, 4};
  ParameterStore whole;
  const int w = whole.declare("w", shape, InitKind::normal, true);
  whole.allocate(nullptr);
  whole.initialize(5, 0.02f, 2);
  for (int index = 0; index < 2; ++index) {
    ParameterStore part;
    const TensorShard shard{0, index, 2, 3};
    const int pw =
        part.declare_shard("w", shape, shard, mesh::AxisSet::all(), InitKind::normal, true);
    part.allocate(nullptr);
    part.initialize(5, 0.02f, 2);
    ASSERT_EQ(part.info(pw).shape, (Shape{12, 4}));
    const float* got = part.value(pw);
    for (int64_t block = 0; block < 3; ++block)
      for (int64_t row = 0; row < 4; ++row)
        for (int64_t col = 0; col < 4; ++col)
          ASSERT_EQ(got[(block * 4 + row) * 4 + col],
                    whole.value(w)[(block * 8 + index * 4 + row) * 4 + col])
              << "block " << block << " row " << row << " of shard " << index;
    const SliceWalk walk = slice_walk(part.info(pw));
    EXPECT_EQ(walk.outer, 3);
    EXPECT_EQ(walk.run, 16);
    EXPECT_EQ(walk.stride, 32);
    EXPECT_EQ(walk.first, index * 16);
  }
  // A blocked dimension must split into equal slices of every block.
  ParameterStore bad;
  EXPECT_THROW(bad.declare_shard("w", {24, 4}, TensorShard{0, 0, 3, 3}, mesh::AxisSet::all(),
                                 InitKind::normal, true),
               Error);
}
