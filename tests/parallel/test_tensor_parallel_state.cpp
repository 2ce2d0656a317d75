// Tensor-parallel state as logical tensors (parallel/tensor_parallel_state.hpp) and logical
// checkpoints, on hand-made stores on 2 and 4 tensor-parallel "ranks" (threads on the local
// backend): slices along dimension 0, along dimension 1, along a middle dimension, blocked (q|k|v,
// three blocks each split per rank) and a whole parameter. The reference is the whole store (the
// tp = 1 model) initialised from the same seed and a coordinate-by-coordinate map from a slice's
// elements to the logical tensor's, written here independently of model::slice_walk: the gather
// of the initialised slices is the whole store bit for bit, scatter inverts gather, a sharded
// checkpoint saved from the sliced ranks holds the whole store's logical tensors bit for bit and
// loads back into both, and a
// logical store that does not match is one clear Error on every rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"
#include "lattice/train/checkpoint.hpp"

using namespace lattice;
using lattice::model::ParameterStore;
using lattice::model::TensorShard;
namespace fs = std::filesystem;

namespace {

// A logical parameter and how the tensor-parallel ranks split it: along `dim` (-1: whole on every
// rank), the dimension being `blocks` blocks each split per rank.
struct Logical {
  const char* name;
  Shape shape;
  int dim;
  int blocks;
};

// Every split divides for 2 and 4 ranks; sizes not multiples of the store's 16-element alignment.
const std::vector<Logical> kLogical = {
    {"rows", {8, 12}, 0, 1},      // column-parallel weight: output rows
    {"qkv", {24, 5}, 0, 3},       // packed q | k | v, each split per rank
    {"whole", {10}, -1, 1},       // a norm weight: replicated
    {"cols", {6, 16}, 1, 1},      // row-parallel weight: input columns
    {"cols_qkv", {4, 24}, 1, 3},  // blocked along the last dimension
    {"middle", {3, 8, 5}, 1, 2},  // a middle dimension, two blocks
};

const mesh::AxisSet kNotTp = mesh::AxisSet::all().without(mesh::Axis::tp);
constexpr uint64_t kSeed = 11;

// The store of tensor-parallel rank `rank` of `ranks`; ranks = 1 is the tp = 1 model, every
// parameter declared whole and replicated. `skip`: a parameter left out; `extra`: one more.
ParameterStore make_store(int rank, int ranks, const std::string& skip = "",
                          const std::string& extra = "", bool allocate = true) {
  ParameterStore store;
  for (const Logical& p : kLogical) {
    if (p.name == skip) continue;
    if (ranks == 1 || p.dim < 0)
      store.declare(p.name, p.shape, model::InitKind::normal, true);
    else
      store.declare_shard(p.name, p.shape, TensorShard{p.dim, rank, ranks, p.blocks}, kNotTp,
                          model::InitKind::normal, true);
  }
  if (!extra.empty()) store.declare(extra, {3}, model::InitKind::normal, true);
  if (allocate) store.allocate(nullptr);
  return store;
}

Shape local_shape(const Logical& p, int ranks) {
  Shape shape = p.shape;
  if (p.dim >= 0) shape[static_cast<size_t>(p.dim)] /= ranks;
  return shape;
}

// The row-major logical index of element `i` of rank `rank`'s slice of `p`, coordinate by
// coordinate: a local coordinate c along the split dimension lies in block c / per (per = its
// rows of one block) and is row rank * per + c % per of that block.
int64_t logical_index(const Logical& p, int rank, int ranks, int64_t i) {
  const Shape local = local_shape(p, ranks);
  std::vector<int64_t> coordinate(local.size());
  for (size_t d = local.size(); d-- > 0;) {
    coordinate[d] = i % local[d];
    i /= local[d];
  }
  if (p.dim >= 0) {
    const auto dim = static_cast<size_t>(p.dim);
    const int64_t per = local[dim] / p.blocks;
    const int64_t block = coordinate[dim] / per;
    coordinate[dim] = block * (p.shape[dim] / p.blocks) + rank * per + coordinate[dim] % per;
  }
  int64_t index = 0;
  for (size_t d = 0; d < p.shape.size(); ++d) index = index * p.shape[d] + coordinate[d];
  return index;
}

// Logical values for every parameter, laid out as the whole store's values: distinct random
// floats (alignment gaps zero).
std::vector<float> random_logical(const ParameterStore& whole, uint32_t seed) {
  std::vector<float> values(static_cast<size_t>(whole.size()), 0.0f);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& p : whole.parameters())
    for (int64_t i = 0; i < p.numel; ++i) values[static_cast<size_t>(p.offset + i)] = normal(gen);
  return values;
}

// Whether `a` and `b` (laid out as `store`) hold the same bits in every parameter element.
::testing::AssertionResult same_parameters(const ParameterStore& store, const float* a,
                                           const float* b) {
  for (const auto& p : store.parameters())
    if (std::memcmp(a + p.offset, b + p.offset, static_cast<size_t>(p.numel) * 4) != 0)
      return ::testing::AssertionFailure() << "parameter '" << p.name << "' differs";
  return ::testing::AssertionSuccess();
}

// Rank `rank`'s slices of the logical buffer `logical_values` (laid out as `whole`), by the
// coordinate map, laid out as `local`.
std::vector<float> naive_slices(const ParameterStore& whole, const float* logical_values,
                                const ParameterStore& local, int rank, int ranks) {
  std::vector<float> out(static_cast<size_t>(local.size()), 0.0f);
  for (const Logical& p : kLogical) {
    const auto& mine = local.info(local.index_of(p.name));
    const float* source = logical_values + whole.info(whole.index_of(p.name)).offset;
    for (int64_t i = 0; i < mine.numel; ++i)
      out[static_cast<size_t>(mine.offset + i)] = source[logical_index(p, rank, ranks, i)];
  }
  return out;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The logical shape of a checkpoint tensor ("name", "exp_avg/name", "exp_avg_sq/name") of `whole`.
Shape logical_shape(const ParameterStore& whole, std::string name) {
  for (const char* prefix : {"exp_avg/", "exp_avg_sq/"})
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::string(prefix).size());
  return whole.info(whole.index_of(name)).global_shape;
}

TEST(TensorParallelState, InitializedSlicesAreTheCoordinateMapOfTheWholeStore) {
  // The reference map itself, against initialize(): each rank's initialised slice holds the whole
  // parameter's values where the map says.
  ParameterStore whole = make_store(0, 1);
  whole.initialize(kSeed, 0.02f, 2);
  for (int ranks : {2, 4})
    for (int rank = 0; rank < ranks; ++rank) {
      ParameterStore store = make_store(rank, ranks);
      store.initialize(kSeed, 0.02f, 2);
      const std::vector<float> expected = naive_slices(whole, whole.values(), store, rank, ranks);
      EXPECT_TRUE(same_parameters(store, store.values(), expected.data()))
          << "rank " << rank << " of " << ranks;
    }
}

TEST(TensorParallelState, GatherOfInitializedSlicesIsTheWholeStoreBitForBit) {
  ParameterStore whole = make_store(0, 1);
  whole.initialize(kSeed, 0.02f, 2);
  // Gradients, a buffer other than the values: rank r's slices of known logical values, placed
  // by the coordinate map.
  const std::vector<float> logical_grads = random_logical(whole, 3);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(ranks));
    std::vector<float> gathered_values, gathered_grads;
    comm::run_local_ranks(ranks, [&](comm::Communicator& tp) {
      ParameterStore store = make_store(tp.rank(), ranks);
      store.initialize(kSeed, 0.02f, 2);
      const std::vector<float> grads =
          naive_slices(whole, logical_grads.data(), store, tp.rank(), ranks);
      std::copy(grads.begin(), grads.end(), store.grads());
      const ParameterStore logical = make_store(0, 1, "", "", false);  // declared only
      std::vector<float> values_out, grads_out;
      if (tp.rank() == 0) {  // the other ranks pass no buffer: only rank 0's is filled
        values_out.assign(static_cast<size_t>(logical.size()),
                          std::numeric_limits<float>::quiet_NaN());
        grads_out = values_out;
      }
      parallel::gather_logical(store, store.values(), logical,
                               tp.rank() == 0 ? values_out.data() : nullptr, tp);
      parallel::gather_logical(store, store.grads(), logical,
                               tp.rank() == 0 ? grads_out.data() : nullptr, tp);
      if (tp.rank() == 0) {
        gathered_values = std::move(values_out);
        gathered_grads = std::move(grads_out);
      }
    });
    EXPECT_TRUE(same_parameters(whole, gathered_values.data(), whole.values()));
    EXPECT_TRUE(same_parameters(whole, gathered_grads.data(), logical_grads.data()));
  }
}

TEST(TensorParallelState, ScatterGivesEachRankItsSlicesAndGatherInvertsIt) {
  const ParameterStore whole = make_store(0, 1);
  const std::vector<float> logical_values = random_logical(whole, 7);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(ranks));
    std::vector<float> gathered;
    comm::run_local_ranks(ranks, [&](comm::Communicator& tp) {
      ParameterStore store = make_store(tp.rank(), ranks);
      parallel::scatter_logical(whole, logical_values.data(), store, store.mutable_values());
      const std::vector<float> expected =
          naive_slices(whole, logical_values.data(), store, tp.rank(), ranks);
      EXPECT_TRUE(same_parameters(store, store.values(), expected.data())) << "rank " << tp.rank();
      std::vector<float> out(tp.rank() == 0 ? static_cast<size_t>(whole.size()) : 0, 0.0f);
      parallel::gather_logical(store, store.values(), whole, out.data(), tp);
      if (tp.rank() == 0) gathered = std::move(out);
    });
    EXPECT_TRUE(same_parameters(whole, gathered.data(), logical_values.data()));
  }
}

class TensorParallelCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice-tp-checkpoint-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    config_ = model::model_preset("gpt2-tiny");  // recorded in the metadata; checked on load
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  model::ModelConfig config_;
  const train::TrainerState state_{7, 70, kSeed};
};

TEST_F(TensorParallelCheckpoint,
       SlicedRanksWriteTheirOwnShardsOfTheWholeStoreAndLoadBackBitForBit) {
  kernels::CpuOps ops;
  ParameterStore whole = make_store(0, 1);
  whole.initialize(kSeed, 0.02f, 2);
  const std::vector<float> m = random_logical(whole, 21), v = random_logical(whole, 22);
  optim::AdamWOptimizer whole_adamw(ops, whole, {}, nullptr);
  std::copy(m.begin(), m.end(), whole_adamw.exp_avg());
  std::copy(v.begin(), v.end(), whole_adamw.exp_avg_sq());
  whole_adamw.set_steps_taken(5);
  const fs::path reference = train::save_checkpoint((dir_ / "whole").string(), config_, whole,
                                                    whole_adamw, state_, "x", 2);

  for (int ranks : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(ranks));
    const std::string run_dir = (dir_ / ("tp" + std::to_string(ranks))).string();
    std::vector<std::string> dirs(static_cast<size_t>(ranks));
    comm::run_local_ranks(ranks, [&](comm::Communicator& tp) {
      ParameterStore store = make_store(tp.rank(), ranks);
      store.initialize(kSeed, 0.02f, 2);
      optim::AdamWOptimizer adamw(ops, store, {}, nullptr);
      parallel::scatter_logical(whole, m.data(), store, adamw.exp_avg());
      parallel::scatter_logical(whole, v.data(), store, adamw.exp_avg_sq());
      adamw.set_steps_taken(5);
      dirs[static_cast<size_t>(tp.rank())] =
          train::save_checkpoint(run_dir, config_, store, adamw, state_, "x", 2, tp);

      // Back into a fresh sliced store on every rank (no communication: each reads the files).
      ParameterStore loaded = make_store(tp.rank(), ranks);
      optim::AdamWOptimizer loaded_adamw(ops, loaded, {}, nullptr);
      // No barrier: save_checkpoint returns on every rank only once rank 0 has published.
      const train::TrainerState state = train::load_checkpoint(dirs[static_cast<size_t>(tp.rank())],
                                                               config_, loaded, &loaded_adamw);
      EXPECT_EQ(state.step, 7);
      EXPECT_EQ(state.samples_consumed, 70);
      EXPECT_EQ(loaded_adamw.steps_taken(), 5);
      EXPECT_TRUE(same_parameters(store, loaded.values(), store.values()));
      EXPECT_TRUE(same_parameters(store, loaded_adamw.exp_avg(), adamw.exp_avg()));
      EXPECT_TRUE(same_parameters(store, loaded_adamw.exp_avg_sq(), adamw.exp_avg_sq()));
    });
    for (const std::string& dir : dirs) EXPECT_EQ(dir, dirs[0]);
    // Each rank wrote its own files (sharded, nothing gathered), and the logical tensors they
    // hold are the whole store's, bit for bit.
    for (int r = 0; r < ranks; ++r)
      EXPECT_TRUE(
          fs::exists(fs::path(dirs[0]) / ("model-rank-0000" + std::to_string(r) + "-of-0000" +
                                          std::to_string(ranks) + ".safetensors")));
    EXPECT_EQ(file_bytes(fs::path(dirs[0]) / "state.json"), file_bytes(reference / "state.json"));
    train::CheckpointReader sharded(dirs[0]), one(reference.string());
    EXPECT_EQ(sharded.names(), one.names());
    for (const std::string& name : one.names()) {
      const Shape shape = logical_shape(whole, name);
      std::vector<float> a(static_cast<size_t>(shape_numel(shape))), b(a.size());
      sharded.read(name, shape, a.data());
      one.read(name, shape, b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name;
    }
    // And the tp = 1 store loads it with the one-rank loader.
    ParameterStore loaded = make_store(0, 1);
    optim::AdamWOptimizer loaded_adamw(ops, loaded, {}, nullptr);
    train::load_checkpoint(dirs[0], config_, loaded, &loaded_adamw);
    EXPECT_TRUE(same_parameters(whole, loaded.values(), whole.values()));
    EXPECT_TRUE(same_parameters(whole, loaded_adamw.exp_avg(), m.data()));
    EXPECT_TRUE(same_parameters(whole, loaded_adamw.exp_avg_sq(), v.data()));
  }
}

TEST_F(TensorParallelCheckpoint, ATransformerWithAGroupOfOneWritesTheOneRankBytes) {
  // The tensor-parallel form with tp = 1 (what a trainer calls for every layout) is the one-rank
  // checkpoint byte for byte.
  config_.vocab_size = 256;
  config_.max_seq_len = 32;
  model::Transformer model(config_, nullptr);
  model.initialize(kSeed);
  kernels::CpuOps ops;
  optim::AdamWOptimizer adamw(ops, model.parameters(), {}, nullptr);
  for (int64_t i = 0; i < model.parameters().size(); ++i)
    adamw.exp_avg()[i] = 0.001f * static_cast<float>(i % 97);
  const fs::path plain =
      train::save_checkpoint((dir_ / "plain").string(), model, adamw, state_, "", 2);
  fs::path grouped;
  comm::run_local_ranks(1, [&](comm::Communicator& tp) {
    grouped = train::save_checkpoint((dir_ / "grouped").string(), model, adamw, state_, "", 2, tp);
  });
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"})
    EXPECT_EQ(file_bytes(grouped / file), file_bytes(plain / file)) << file;
}

TEST_F(TensorParallelCheckpoint, SlicesWithoutTheirGroupAndOtherLogicalShapesAreRefused) {
  kernels::CpuOps ops;
  ParameterStore store = make_store(0, 2);
  optim::AdamWOptimizer adamw(ops, store, {}, nullptr);
  try {
    train::save_checkpoint((dir_ / "sliced").string(), config_, store, adamw, state_, "", 2);
    ADD_FAILURE() << "a sliced store saved without its tensor-parallel group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-parallel group"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "sliced"));  // nothing written
  // A logical checkpoint whose "rows" is [8, 12] does not load into slices of a [16, 12] "rows".
  ParameterStore whole = make_store(0, 1);
  optim::AdamWOptimizer whole_adamw(ops, whole, {}, nullptr);
  const std::string checkpoint =
      train::save_checkpoint((dir_ / "whole").string(), config_, whole, whole_adamw, state_, "", 2);
  ParameterStore wider;
  for (const Logical& p : kLogical) {
    Shape shape = p.shape;
    if (std::string(p.name) == "rows") shape[0] = 16;
    if (p.dim < 0)
      wider.declare(p.name, shape, model::InitKind::normal, true);
    else
      wider.declare_shard(p.name, shape, TensorShard{p.dim, 1, 2, p.blocks}, kNotTp,
                          model::InitKind::normal, true);
  }
  wider.allocate(nullptr);
  try {
    train::load_checkpoint(checkpoint, config_, wider, nullptr);
    ADD_FAILURE() << "a checkpoint of another logical shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 'rows' with logical shape [8, 12], this model's is "
                                         "[16, 12]"),
              std::string::npos)
        << e.what();
  }
}

// The error every rank of a 2-rank gather reports ("" where none was thrown); `rank_store`
// builds rank r's store and `logical` is the logical store every rank passes.
std::vector<std::string> gather_errors(const std::function<ParameterStore(int)>& rank_store,
                                       const std::function<ParameterStore()>& logical) {
  std::vector<std::string> errors(2);
  comm::run_local_ranks(2, [&](comm::Communicator& tp) {
    const ParameterStore store = rank_store(tp.rank());
    const ParameterStore whole = logical();
    std::vector<float> out(static_cast<size_t>(whole.size()), 0.0f);
    try {
      parallel::gather_logical(store, store.values(), whole, out.data(), tp);
    } catch (const Error& e) {
      errors[static_cast<size_t>(tp.rank())] = e.what();
    }
  });
  return errors;
}

TEST(TensorParallelState, MismatchedLogicalStoresAreOneClearErrorOnEveryRank) {
  auto sliced = [](int rank) { return make_store(rank, 2); };
  struct Case {
    std::function<ParameterStore()> logical;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[] { return make_store(0, 1, "cols"); },
       "the logical model has no parameter 'cols' of the sharded model: build the logical store "
       "from the same model configuration"},
      {[] { return make_store(0, 1, "", "extra"); },
       "the logical model has parameter 'extra', which the sharded model lacks (7 parameters "
       "against 6)"},
      {[] {
         ParameterStore s;
         for (const Logical& p : kLogical) {
           Shape shape = p.shape;
           if (std::string(p.name) == "qkv") shape[1] = 6;
           s.declare(p.name, shape, model::InitKind::normal, true);
         }
         s.allocate(nullptr);
         return s;
       },
       "parameter 'qkv' has logical shape [24, 5] in the sharded model but [24, 6] in the logical "
       "model"},
      {[] { return make_store(0, 2); }, "the logical model's 'rows' is itself slice 0 of 2"},
  };
  for (const Case& c : cases) {
    for (const std::string& error : gather_errors(sliced, c.logical)) {
      EXPECT_NE(error.find(c.expected), std::string::npos) << error;
      EXPECT_EQ(error.find('\n'), std::string::npos);
    }
    // scatter_logical checks the same, on one rank.
    const ParameterStore whole = c.logical();
    ParameterStore store = sliced(1);
    std::vector<float> logical_values(static_cast<size_t>(whole.size()), 0.0f);
    try {
      parallel::scatter_logical(whole, logical_values.data(), store, store.mutable_values());
      ADD_FAILURE() << "scatter accepted a mismatched logical store";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
    }
  }
  // Ranks whose stores differ: every rank refuses, none is left waiting for a slice.
  const auto other_layouts =
      gather_errors([](int rank) { return make_store(rank, 2, rank == 1 ? "whole" : ""); },
                    [] { return make_store(0, 1); });
  // Rank 1 lacks "whole", so its own check fails; rank 0 learns another rank refused.
  EXPECT_NE(other_layouts[1].find("has parameter 'whole', which the sharded model lacks"),
            std::string::npos)
      << other_layouts[1];
  EXPECT_NE(other_layouts[0].find("another rank of the tensor-parallel group cannot gather"),
            std::string::npos)
      << other_layouts[0];
  const auto extra_on_one =
      gather_errors([](int rank) { return make_store(rank, 2, "", rank == 1 ? "extra" : ""); },
                    [] { return make_store(0, 1, "", "extra"); });
  // Rank 0 lacks "extra", so its own check fails; rank 1 passes its check and learns of it.
  EXPECT_NE(extra_on_one[0].find("'extra', which the sharded model lacks"), std::string::npos)
      << extra_on_one[0];
  EXPECT_NE(extra_on_one[1].find("another rank"), std::string::npos) << extra_on_one[1];
  const auto reordered = gather_errors(
      [](int rank) {
        ParameterStore s;
        std::vector<Logical> order = kLogical;
        if (rank == 1) std::swap(order[0], order[1]);
        for (const Logical& p : order) {
          if (p.dim < 0)
            s.declare(p.name, p.shape, model::InitKind::normal, true);
          else
            s.declare_shard(p.name, p.shape, TensorShard{p.dim, rank, 2, p.blocks}, kNotTp,
                            model::InitKind::normal, true);
        }
        s.allocate(nullptr);
        return s;
      },
      [] { return make_store(0, 1); });
  for (const std::string& error : reordered)
    EXPECT_NE(error.find("hold parameter stores of different layouts"), std::string::npos) << error;
  // Rank r must hold slice r.
  const auto swapped = gather_errors([](int rank) { return make_store(1 - rank, 2); },
                                     [] { return make_store(0, 1); });
  EXPECT_NE(swapped[0].find("is slice 1 of 2 on tensor-parallel rank 0 of 2"), std::string::npos)
      << swapped[0];
}

}  // namespace
