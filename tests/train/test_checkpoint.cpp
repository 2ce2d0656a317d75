// Sharded checkpoints (train/sharded_checkpoint.hpp, checkpoint_index.hpp, checkpoint_reader.hpp):
// one rank writes model.safetensors and optimizer.safetensors holding every tensor whole plus an
// index with a CRC-32C per piece; ranks that each own runs of the store (as ZeRO shards do) write
// only those runs, and the reader puts the logical tensors back together bit for bit; a checkpoint
// of the format before the index still loads; a failing rank fails the save on every rank and
// leaves the previous checkpoint the latest; damage — a flipped byte, a missing rank file, a lost
// piece, another logical shape — is one clear line naming the file or tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/sharded_checkpoint.hpp"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice-checkpoint-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    config_ = model::model_preset("gpt2-tiny");
    config_.vocab_size = 256;
    config_.max_seq_len = 32;
    model_ = std::make_unique<model::Transformer>(config_, nullptr);
    model_->initialize(3);
    adamw_ = std::make_unique<optim::AdamWOptimizer>(ops_, model_->parameters(),
                                                     optim::AdamWSettings{}, nullptr);
    for (int64_t i = 0; i < model_->parameters().size(); ++i) {
      adamw_->exp_avg()[i] = 0.001f * static_cast<float>(i % 97);
      adamw_->exp_avg_sq()[i] = 0.002f * static_cast<float>(i % 89);
    }
    adamw_->set_steps_taken(7);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save_one_rank() {
    return train::save_checkpoint(dir_.string(), *model_, *adamw_, {7, 70, 1}, "", 2);
  }

  // `ranks` ranks of one store, rank r owning the r-th of `ranks` equal runs of the flat buffer
  // (cut through the middle of parameters, as ZeRO's bucket shards are). Returns the directory.
  // With `failing_rank`, that rank's moments cannot be read: `errors` gets every rank's error.
  std::string save_split(int ranks, int failing_rank = -1, int64_t step = 9,
                         std::vector<std::string>* errors = nullptr) {
    std::string dir;
    if (errors) errors->assign(static_cast<size_t>(ranks), "");
    const model::ParameterStore& store = model_->parameters();
    comm::run_local_ranks(ranks, [&](comm::Communicator& world) {
      const int64_t n = store.size(), r = world.rank();
      train::CheckpointSource source;
      source.store = &store;
      source.values = store.values();
      source.ranges = {{n * r / ranks, n * (r + 1) / ranks}};
      source.moments = [&](int64_t begin, int64_t end, float* m, float* v) {
        if (r == failing_rank) throw Error("rank " + std::to_string(r) + " lost its moments");
        std::copy(adamw_->exp_avg() + begin, adamw_->exp_avg() + end, m);
        std::copy(adamw_->exp_avg_sq() + begin, adamw_->exp_avg_sq() + end, v);
      };
      const train::CheckpointContents contents{
          dir_.string(), config_, {step, step * 10, 1}, 7, "", 2, "dp" + std::to_string(ranks)};
      try {
        const std::string written = train::save_sharded_checkpoint(contents, {&source, 1}, world);
        if (r == 0) dir = written;
      } catch (const Error& e) {
        if (!errors) throw;
        (*errors)[static_cast<size_t>(r)] = e.what();
      }
    });
    return dir;
  }

  // Loads `checkpoint` into a fresh model; expects the saved weights and moments bit for bit.
  void expect_loads_back(const std::string& checkpoint) {
    model::Transformer loaded(config_, nullptr);
    optim::AdamWOptimizer adamw(ops_, loaded.parameters(), {}, nullptr);
    const train::TrainerState state = train::load_checkpoint(checkpoint, loaded, &adamw);
    EXPECT_EQ(adamw.steps_taken(), 7);
    const size_t bytes = static_cast<size_t>(model_->parameters().size()) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(loaded.parameters().values(), model_->parameters().values(), bytes));
    EXPECT_EQ(0, std::memcmp(adamw.exp_avg(), adamw_->exp_avg(), bytes));
    EXPECT_EQ(0, std::memcmp(adamw.exp_avg_sq(), adamw_->exp_avg_sq(), bytes));
    (void)state;
  }

  std::string load_error(const std::string& checkpoint) {
    model::Transformer loaded(config_, nullptr);
    optim::AdamWOptimizer adamw(ops_, loaded.parameters(), {}, nullptr);
    try {
      train::load_checkpoint(checkpoint, loaded, &adamw);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  model::ModelConfig config_;
  kernels::CpuOps ops_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<optim::AdamWOptimizer> adamw_;
};

nlohmann::json read_index(const std::string& checkpoint) {
  return nlohmann::json::parse(read_file_text((fs::path(checkpoint) / "index.json").string()));
}

TEST_F(ShardedCheckpoint, OneRankWritesEveryTensorWholeWithItsChecksum) {
  const std::string checkpoint = save_one_rank();
  const nlohmann::json index = read_index(checkpoint);
  EXPECT_EQ(index.at("format"), "lattice.sharded_checkpoint");
  const auto& tensors = index.at("tensors");
  // Every parameter and both of its moments, each one whole piece.
  EXPECT_EQ(tensors.size(), 3 * model_->parameters().parameters().size());
  SafetensorsFile weights((fs::path(checkpoint) / "model.safetensors").string());
  for (const auto& p : model_->parameters().parameters()) {
    const auto& pieces = tensors.at(p.name).at("pieces");
    ASSERT_EQ(pieces.size(), 1u) << p.name;
    EXPECT_EQ(pieces[0].at("file"), "model.safetensors");
    EXPECT_EQ(pieces[0].at("key"), p.name);
    EXPECT_EQ(pieces[0].at("end").get<int64_t>(), p.numel);
    const SafetensorsEntry& e = weights.entry(p.name);
    EXPECT_EQ(e.shape, p.shape);
    EXPECT_EQ(0,
              std::memcmp(e.data, model_->parameters().value(model_->parameters().index_of(p.name)),
                          e.nbytes))
        << p.name;
    EXPECT_EQ(tensors.at("exp_avg/" + p.name).at("pieces")[0].at("file"), "optimizer.safetensors");
  }
  expect_loads_back(checkpoint);
}

TEST_F(ShardedCheckpoint, RanksWriteOnlyTheirRunsAndTheReaderPutsThemTogether) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(ranks);
    const std::string checkpoint = save_split(ranks);
    // Each rank's file holds about 1/ranks of the bytes, and no rank wrote the whole store.
    const auto total = static_cast<double>(model_->parameters().size()) * 4;
    for (int r = 0; r < ranks; ++r) {
      const fs::path file =
          fs::path(checkpoint) / ("model-rank-0000" + std::to_string(r) + "-of-0000" +
                                  std::to_string(ranks) + ".safetensors");
      ASSERT_TRUE(fs::exists(file)) << file;
      EXPECT_LT(static_cast<double>(fs::file_size(file)), total / ranks * 1.1 + 65536) << file;
    }
    EXPECT_FALSE(fs::exists(fs::path(checkpoint) / "model.safetensors"));
    EXPECT_FALSE(fs::exists(fs::path(checkpoint) / "pieces-rank-00000.json"));
    // A cut parameter is two pieces keyed name#begin.
    size_t cut = 0;
    const nlohmann::json index = read_index(checkpoint);
    for (const auto& [name, tensor] : index.at("tensors").items())
      if (tensor.at("pieces").size() > 1) ++cut;
    EXPECT_GE(cut, 3u);  // at least one parameter and its two moments
    expect_loads_back(checkpoint);
    const train::CheckpointReader reader(checkpoint);
    EXPECT_EQ(reader.state().step, 9);
    EXPECT_EQ(reader.state().samples_consumed, 90);
  }
}

TEST_F(ShardedCheckpoint, AFailingRankFailsTheSaveEverywhereAndKeepsThePreviousLatest) {
  const std::string good = save_split(2);
  std::vector<std::string> errors;
  save_split(3, 1, 11, &errors);
  EXPECT_NE(errors[1].find("rank 1 lost its moments"), std::string::npos) << errors[1];
  for (int r : {0, 2})
    EXPECT_NE(errors[static_cast<size_t>(r)].find("another rank could not write its shard"),
              std::string::npos)
        << errors[static_cast<size_t>(r)];
  // Nothing of step 11 is left, staged or published, and `latest` still names step 9.
  for (const auto& entry : fs::directory_iterator(dir_ / "checkpoints"))
    EXPECT_EQ(entry.path().filename().string().find("step_00000011"), std::string::npos)
        << entry.path();
  EXPECT_EQ(train::latest_checkpoint(dir_.string()), good);
  expect_loads_back(good);
}

TEST_F(ShardedCheckpoint, TheFormatBeforeTheIndexStillLoads) {
  const std::string checkpoint = save_one_rank();
  fs::remove(fs::path(checkpoint) / "index.json");  // model/optimizer.safetensors + state.json
  expect_loads_back(checkpoint);
  EXPECT_EQ(train::read_checkpoint_model_config(checkpoint).d_model, config_.d_model);
}

TEST_F(ShardedCheckpoint, DamageIsOneLineNamingTheFileOrTensor) {
  // A flipped byte inside a tensor's data: its checksum names the tensor and the file.
  {
    const std::string checkpoint = save_split(2);
    const fs::path file = fs::path(checkpoint) / "model-rank-00001-of-00002.safetensors";
    SafetensorsFile read(file.string());
    const std::string victim = read.names().back();
    const uint64_t header = [&] {
      std::ifstream in(file, std::ios::binary);
      uint64_t n = 0;
      in.read(reinterpret_cast<char*>(&n), 8);
      return n;
    }();
    const uint64_t at = 8 + header + read.entry(victim).data_begin + 1;
    {
      std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(static_cast<std::streamoff>(at));
      char c = 0;
      io.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      io.seekp(static_cast<std::streamoff>(at));
      io.write(&c, 1);
    }
    const std::string error = load_error(checkpoint);
    EXPECT_NE(error.find("'" + victim +
                         "' in model-rank-00001-of-00002.safetensors fails its "
                         "checksum"),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find('\n'), std::string::npos);
    // A missing rank file.
    fs::remove(file);
    const std::string missing = load_error(checkpoint);
    EXPECT_NE(missing.find("lacks model-rank-00001-of-00002.safetensors, which its index lists"),
              std::string::npos)
        << missing;
    fs::remove_all(dir_);
  }
  // A piece lost from the index: the elements it held are named.
  {
    const std::string checkpoint = save_split(2);
    nlohmann::json index = read_index(checkpoint);
    std::string cut;
    for (auto& [name, tensor] : index.at("tensors").items())
      if (tensor.at("pieces").size() > 1 && name.find('/') == std::string::npos) {
        cut = name;
        tensor.at("pieces").erase(1);
        break;
      }
    ASSERT_FALSE(cut.empty());
    write_text_atomic((fs::path(checkpoint) / "index.json").string(), index.dump());
    const std::string error = load_error(checkpoint);
    EXPECT_NE(error.find("is missing elements ["), std::string::npos) << error;
    EXPECT_NE(error.find("of '" + cut + "'"), std::string::npos) << error;
    fs::remove_all(dir_);
  }
  // Another logical shape.
  {
    const std::string checkpoint = save_one_rank();
    nlohmann::json index = read_index(checkpoint);
    const std::string name = "transformer.h.0.attn.c_attn.weight";
    index["tensors"][name]["global_shape"] = {1, 2};
    write_text_atomic((fs::path(checkpoint) / "index.json").string(), index.dump());
    const std::string error = load_error(checkpoint);
    EXPECT_NE(error.find("holds '" + name + "' with logical shape [1, 2]"), std::string::npos)
        << error;
  }
}

}  // namespace
