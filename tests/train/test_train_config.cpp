// TrainConfig's [activation_checkpoint] section and its layout: parsing, overrides, the resolved
// TOML, bad values named with their key, and the dp x tp x pp x cp world: accepted by the one
// layout validator, resolved against a launcher's world size, and refused with one line per axis
// this trainer does not run yet — in process and through the `lattice train` binary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "lattice/core/error.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {
namespace {

namespace fs = std::filesystem;
using lattice::testing::expect_one_error_line;
using lattice::testing::fresh_directory;
using lattice::testing::run_lattice;

// The message load_train_config throws for `overrides` (empty when it accepts them).
std::string refusal(const std::vector<std::string>& overrides, const std::string& path = "") {
  try {
    load_train_config(path, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Sets an environment variable for the scope of a test (the launcher a run would see).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (previous_)
      setenv(name_, previous_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

TEST(ActivationCheckpointConfig, DefaultsToNoneEveryBlock) {
  const TrainConfig config = load_train_config("", {});
  EXPECT_EQ(config.activation_checkpoint.mode, model::Recompute::kNone);
  EXPECT_EQ(config.activation_checkpoint.interval, 1);
  EXPECT_EQ(config.layout().recompute, model::Recompute::kNone);
}

TEST(ActivationCheckpointConfig, ParsesTheSectionAndOverrides) {
  const fs::path dir = fresh_directory("activation-checkpoint-config");
  std::ofstream(dir / "full.toml") << "[activation_checkpoint]\nmode = \"full\"\ninterval = 3\n";
  const TrainConfig full = load_train_config((dir / "full.toml").string(), {});
  EXPECT_EQ(full.activation_checkpoint.mode, model::Recompute::kFull);
  EXPECT_EQ(full.activation_checkpoint.interval, 3);
  // The layout the planner estimates carries the same setting.
  EXPECT_EQ(full.layout().recompute, model::Recompute::kFull);
  EXPECT_EQ(full.layout().recompute_interval, 3);
  EXPECT_TRUE(full.activation_checkpoint.recomputes_block(3));
  EXPECT_FALSE(full.activation_checkpoint.recomputes_block(4));

  const TrainConfig selective = load_train_config("", {"--activation_checkpoint.mode=selective"});
  EXPECT_EQ(selective.activation_checkpoint.mode, model::Recompute::kSelective);
  EXPECT_EQ(load_train_config("", {}).activation_checkpoint.mode, model::Recompute::kNone);
  // A command-line override wins over the file.
  const TrainConfig overridden =
      load_train_config((dir / "full.toml").string(),
                        {"activation_checkpoint.mode=full", "activation_checkpoint.interval=1"});
  EXPECT_EQ(overridden.activation_checkpoint.interval, 1);
  fs::remove_all(dir);
}

TEST(ActivationCheckpointConfig, ResolvedTomlRoundTrips) {
  const TrainConfig config = load_train_config(
      "", {"activation_checkpoint.mode=full", "activation_checkpoint.interval=2"});
  const std::string toml = config.to_toml();
  EXPECT_NE(toml.find("[activation_checkpoint]"), std::string::npos) << toml;
  EXPECT_NE(toml.find("mode = 'full'"), std::string::npos) << toml;
  EXPECT_NE(toml.find("interval = 2"), std::string::npos) << toml;
  const fs::path dir = fresh_directory("activation-checkpoint-toml");
  std::ofstream(dir / "resolved.toml") << toml;
  const TrainConfig again = load_train_config((dir / "resolved.toml").string(), {});
  EXPECT_EQ(again.activation_checkpoint.mode, model::Recompute::kFull);
  EXPECT_EQ(again.activation_checkpoint.interval, 2);
  EXPECT_EQ(again.to_toml(), toml);
  fs::remove_all(dir);
}

TEST(ActivationCheckpointConfig, BadValuesNameTheKey) {
  EXPECT_NE(refusal({"activation_checkpoint.mode=sometimes"})
                .find("recompute mode 'sometimes' is unknown (activation_checkpoint.mode"),
            std::string::npos);
  EXPECT_NE(refusal({"activation_checkpoint.mode=3"})
                .find("config key activation_checkpoint.mode must be a string"),
            std::string::npos);
  EXPECT_NE(refusal({"activation_checkpoint.mode=full", "activation_checkpoint.interval=0"})
                .find("activation_checkpoint.interval = 0 is not a block interval"),
            std::string::npos);
  EXPECT_NE(refusal({"activation_checkpoint.interval=\"2\""})
                .find("config key activation_checkpoint.interval must be an integer"),
            std::string::npos);
  EXPECT_NE(refusal({"activation_checkpoint.mode=selective", "activation_checkpoint.interval=2"})
                .find("applies to mode = \"full\" only"),
            std::string::npos);
  EXPECT_NE(refusal({"activation_checkpoint.every=2"})
                .find("unknown config key activation_checkpoint.every"),
            std::string::npos);
}

// The world is dp x tp x pp x cp: the one validator accepts such layouts (the planner runs the same
// check), and the trainer's mesh resolves them against the communicator's size.
TEST(LayoutConfig, WorldOfDpTpPpCpIsAcceptedByTheValidatorAndResolved) {
  TrainConfig config = load_train_config("", {"training.global_batch_size=16"});
  config.parallelism.tp = 2;
  config.parallelism.pp = 2;
  config.parallelism.cp = 2;
  config.parallelism.dp = 2;
  config.training.micro_batch_size = 4;  // 16 sequences = 4 x 2 accumulation steps x dp 2
  parallel::ParallelLayout layout = config.layout();
  EXPECT_EQ(layout.world_size(), 16);
  EXPECT_EQ(config.world_size(), 16);
  // gpt2-demo: 6 heads, 4 layers, sequence 128.
  EXPECT_NO_THROW(parallel::validate_layout(config.model, config.training.seq_len, layout));
  EXPECT_EQ(resolve_layout(config, 16), (mesh::MeshShape{2, 2, 2, 2, 1}));
  config.parallelism.dp = -1;  // the rest of the world
  EXPECT_EQ(resolve_layout(config, 32), (mesh::MeshShape{2, 4, 2, 2, 1}));
  // A world the product does not make.
  config.parallelism.dp = 2;
  try {
    resolve_layout(config, 12);
    ADD_FAILURE() << "a 16-rank layout on 12 ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not equal the world size 12"), std::string::npos)
        << e.what();
  }
  // The validator still refuses what does not divide the model.
  layout.tp = 4;  // 6 heads
  EXPECT_THROW(parallel::validate_layout(config.model, config.training.seq_len, layout), Error);
}

TEST(LayoutConfig, AxesThatCannotRunAreRefusedWithOneLineEach) {
  // Context parallelism runs (issue #23) where the sequence cuts into 2 x cp chunks; Ulysses needs
  // the heads divisible by cp (gpt2-demo: 6 heads, 128 tokens).
  EXPECT_EQ(refusal({"parallelism.cp=2"}), "");
  EXPECT_EQ(refusal({"parallelism.cp=2", "context_parallel.mode=ulysses"}), "");
  const std::string chunks = refusal({"parallelism.cp=3", "training.seq_len=64"});
  EXPECT_NE(chunks.find("pick a seq_len divisible by 6"), std::string::npos) << chunks;
  EXPECT_EQ(chunks.find('\n'), std::string::npos) << chunks;
  EXPECT_NE(refusal({"parallelism.cp=4", "context_parallel.mode=ulysses"})
                .find("holds 6 query and 6 key/value heads, not divisible by cp"),
            std::string::npos);
  EXPECT_NE(refusal({"context_parallel.mode=rings"}).find("use \"ring\" or \"ulysses\""),
            std::string::npos);
  // Pipelines run (issue #22); ZeRO-3 with one is refused with its reason.
  EXPECT_NE(refusal({"parallelism.pp=2", "parallelism.zero=3"}).find("ZeRO-3 would gather"),
            std::string::npos);
  // A layout that does not fit the model is named by the validator first (6 heads, tp = 4).
  EXPECT_NE(refusal({"parallelism.tp=4"}).find("does not divide the 6 attention heads"),
            std::string::npos);
  // Models the planner describes and the trainer does not build yet.
  EXPECT_NE(refusal({"model.dropout=0.1"}).find("model.dropout"), std::string::npos);
}

// MoE models train (issue #24); what does not fit them is one line naming the key.
TEST(LayoutConfig, MoeModelsAndTheirBadInputAreOneLineEach) {
  // The tiny presets' 32 positions: training.seq_len 32 (the default config's is 128).
  auto moe = [](std::vector<std::string> overrides, const std::string& preset = "mixtral-tiny") {
    overrides.insert(overrides.begin(), {"model.preset=" + preset, "training.seq_len=32"});
    return overrides;
  };
  EXPECT_EQ(refusal(moe({})), "");
  EXPECT_EQ(refusal(moe({"parallelism.pp=2"}, "deepseek-moe-tiny")), "");
  EXPECT_EQ(refusal(moe({"parallelism.cp=2"})), "");
  EXPECT_EQ(refusal(moe({"parallelism.tp=2", "parallelism.dp=1", "training.global_batch_size=8"})),
            "");
  EXPECT_EQ(refusal(moe({"parallelism.tp=2", "parallelism.dp=1", "training.global_batch_size=8",
                         "parallelism.sequence_parallel=true"})),
            "");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {moe({"model.top_k=5"}), "model.top_k (5) must be in [1, model.n_experts = 4]"},
      {moe({"model.moe_capacity_factor=0"}),
       "model.moe_capacity_factor = 0.000000 must be positive"},
      {moe({"model.moe_capacity_factor=-1.5"}), "leave it out for dropless routing"},
      {moe({"model.moe_layer_interval=3"}),
       "model.moe_layer_interval = 3 must be in [1, model.n_layers = 2]"},
      {moe({"model.moe_score=relu"}), "use \"softmax\" or \"sigmoid\""},
      {moe({"model.moe_names=qwen"}), "use \"mixtral\" or \"deepseek\""},
      {moe({"model.moe_activation=relu"}), "use \"swiglu\" or \"gelu\""},
      {moe({"model.moe_aux_loss_coef=-0.1"}), "must not be negative"},
      {moe({"model.family=gpt2", "model.n_kv_heads=4"}),
       "MoE layers are built on Llama, Mistral, Qwen 3 and DeepSeek blocks"},
      {moe({"model.family=qwen2"}),
       "MoE layers are built on Llama, Mistral, Qwen 3 and DeepSeek blocks"},
  };
  for (const auto& [overrides, expected] : cases) {
    const std::string message = refusal(overrides);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// dp = -1 under a launcher: the rest of its world once tp x pp x cp is taken, or one clear line
// when that does not divide.
TEST(LayoutConfig, DpMinusOneTakesTheRestOfTheLaunchersWorld) {
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "6");
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "0");
  const TrainConfig config = load_train_config("", {"parallelism.dp=-1"});
  EXPECT_EQ(config.parallelism.dp, 6);
  const std::string message = refusal({"parallelism.dp=-1", "parallelism.tp=4"});
  EXPECT_NE(message.find("world size 6 is not divisible by pp x cp x tp = 4"), std::string::npos)
      << message;
  // With cp 2 the rest is dp 3.
  EXPECT_EQ(load_train_config(
                "", {"parallelism.dp=-1", "parallelism.cp=2", "training.global_batch_size=24"})
                .parallelism.dp,
            3);
}

// Tensor parallelism splits the key/value heads and the MLP width: a tp that does not divide them
// is refused with one line (the attention heads are the validator's).
TEST(LayoutConfig, TensorParallelismMustDivideTheKeyValueHeadsAndTheMlp) {
  EXPECT_EQ(refusal({"parallelism.tp=2", "parallelism.dp=1", "training.global_batch_size=8"}), "");
  const std::string kv =
      refusal({"model.preset=llama-tiny", "training.seq_len=32", "parallelism.tp=4"});
  EXPECT_NE(kv.find("parallelism.tp = 4 does not divide the 2 key/value heads"), std::string::npos)
      << kv;
  EXPECT_EQ(kv.find('\n'), std::string::npos) << kv;
  const std::string mlp = refusal(
      {"model.preset=gpt2-tiny", "training.seq_len=32", "model.ffn_hidden=66", "parallelism.tp=4"});
  EXPECT_NE(mlp.find("parallelism.tp = 4 does not divide the MLP width 66"), std::string::npos)
      << mlp;
}

// Sequence parallelism splits each sequence over the tp ranks: without tp, or with a tp that does
// not divide the sequence, it is refused with one line naming the fix.
TEST(LayoutConfig, SequenceParallelismNeedsATpThatDividesTheSequence) {
  EXPECT_EQ(refusal({"parallelism.tp=2", "parallelism.dp=1", "training.global_batch_size=8",
                     "parallelism.sequence_parallel=true"}),
            "");
  const std::string alone = refusal({"parallelism.sequence_parallel=true"});
  EXPECT_NE(alone.find("set parallelism.tp > 1"), std::string::npos) << alone;
  EXPECT_EQ(alone.find('\n'), std::string::npos) << alone;
  const std::string odd = refusal({"model.preset=gpt2-tiny", "training.seq_len=30",
                                   "parallelism.tp=4", "parallelism.sequence_parallel=true"});
  EXPECT_NE(odd.find("does not divide the sequence length 30"), std::string::npos) << odd;
}

// Through the binary, as a user meets them: exit status 2 and one error line.
class LayoutCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string tiny(const std::string& extra) {
    return "train --job.run_dir=run --model.preset=gpt2-tiny --model.vocab_size=256"
           " --model.max_seq_len=32 --training.seq_len=32 --training.micro_batch_size=2"
           " --training.threads=1 --training.steps=2 --data.train_files=corpus.txt"
           " --validation.freq=0 --metrics.peak_tflops=1 " +
           extra;
  }
  fs::path dir_;
};

TEST_F(LayoutCli, EachAxisThatCannotSplitGetsOneLine) {
  expect_one_error_line(run_lattice(tiny("--cp 3"), dir_),
                        "training.seq_len = 32 cannot be split over parallelism.cp = 3 ranks");
  expect_one_error_line(run_lattice(tiny("--tp 3"), dir_),
                        "parallelism.tp = 3 does not divide the 4 attention heads");
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(LayoutCli, WorldThatDoesNotDivideGetsOneLine) {
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "3");
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "0");
  expect_one_error_line(run_lattice(tiny("--dp -1 --tp 2"), dir_),
                        "world size 3 is not divisible by pp x cp x tp = 2");
}

TEST_F(LayoutCli, ActivationCheckpointIsWrittenIntoTheRunDirectory) {
  const auto r = run_lattice(
      tiny("--activation_checkpoint.mode=full --activation_checkpoint.interval=2"), dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::string resolved = lattice::testing::slurp(dir_ / "run" / "config.toml");
  EXPECT_NE(resolved.find("[activation_checkpoint]\ninterval = 2\nmode = 'full'"),
            std::string::npos)
      << resolved;
  expect_one_error_line(run_lattice(tiny("--activation_checkpoint.mode=half"), dir_),
                        "recompute mode 'half' is unknown");
  expect_one_error_line(
      run_lattice(tiny("--activation_checkpoint.mode=full --activation_checkpoint.interval=-1"),
                  dir_),
      "activation_checkpoint.interval = -1 is not a block interval");
}

// `lattice estimate memory --config`: the planner estimates the model and layout the trainer would
// build from the same config and overrides.
TEST_F(LayoutCli, EstimateMemoryReadsATrainingConfig) {
  std::ofstream(dir_ / "demo.toml")
      << "[model]\npreset = \"gpt2-demo\"\n[training]\nseq_len = 128\n";
  auto estimate = [&](const std::string& extra) {
    const auto r = run_lattice("estimate memory --config demo.toml --json " + extra, dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json none = estimate("--training.micro_batch_size=2");
  EXPECT_EQ(none["parameters"].get<int64_t>(),
            model::Transformer::parameter_count(model::model_preset("gpt2-demo")));
  EXPECT_EQ(none["layout"]["micro_batch_size"].get<int>(), 2);
  EXPECT_EQ(none["layout"]["recompute"], "none");
  const nlohmann::json every_other = estimate(
      "--training.micro_batch_size=2 --activation_checkpoint.mode=full "
      "--activation_checkpoint.interval=2");
  EXPECT_EQ(every_other["layout"]["recompute"], "full");
  EXPECT_EQ(every_other["layout"]["recompute_interval"].get<int>(), 2);
  const nlohmann::json full =
      estimate("--training.micro_batch_size=2 --activation_checkpoint.mode=full");
  auto activations = [](const nlohmann::json& j) {
    return j["stages"][0]["activation_bytes"].get<double>();
  };
  EXPECT_LT(activations(full), activations(every_other));
  EXPECT_LT(activations(every_other), activations(none));
  // The config's checks are the trainer's; by-hand options do not mix with --config.
  expect_one_error_line(run_lattice("estimate memory --config demo.toml --tp 2", dir_),
                        "--tp describes the model or layout by hand");
  expect_one_error_line(
      run_lattice("estimate memory --config demo.toml --activation_checkpoint.mode=most", dir_),
      "recompute mode 'most' is unknown");
  expect_one_error_line(run_lattice("estimate memory --model gpt2-124m --training.steps=3", dir_),
                        "config overrides need --config");
}

// `lattice estimate memory --config` under tensor parallelism: the trainer activations of one tp
// rank (its blocks' shards and head slice; the residual stream as at tp = 1, or its rows under
// sequence parallelism), given as --parallelism overrides, against the peak a tp (and tp + sp) run
// of the same config measures on its rank (the Table 2 rows of Korthikanti et al.).
TEST_F(LayoutCli, EstimateMemoryCountsOneTensorParallelRanksActivations) {
  // 6 layers: sequence parallelism's saving grows with the blocks (each keeps half its norm and
  // residual rows), its cost does not (the gathered rows of the one block in backward).
  const std::string sp = "--parallelism.tp=2 --parallelism.sequence_parallel=true";
  std::vector<double> measured;
  for (const std::string& layout :
       {std::string("--parallelism.tp=1"), std::string("--parallelism.tp=2"), sp}) {
    const auto r = run_lattice(tiny("--model.n_layers=6 " + layout), dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    const std::vector<nlohmann::json> steps =
        lattice::testing::read_jsonl(dir_ / "run" / "metrics.jsonl");
    ASSERT_FALSE(steps.empty());
    measured.push_back(steps.back()["memory"]["peak_activations"].get<double>());
    if (measured.size() == 1) fs::copy_file(dir_ / "run" / "config.toml", dir_ / "tp1.toml");
    fs::remove_all(dir_ / "run");
  }
  auto trainer = [&](const std::string& extra) {
    const auto r = run_lattice("estimate memory --json --config tp1.toml " + extra, dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return nlohmann::json::parse(r.out)["trainer_activations"];
  };
  const nlohmann::json one = trainer(""), two = trainer("--parallelism.tp=2");
  EXPECT_EQ(one["tp"].get<int>(), 1);
  EXPECT_EQ(two["tp"].get<int>(), 2);
  EXPECT_LT(two["total_bytes"].get<double>(), one["total_bytes"].get<double>());
  EXPECT_LT(two["block_bytes"].get<double>(), one["block_bytes"].get<double>());
  EXPECT_EQ(two["residual_bytes"].get<double>(), one["residual_bytes"].get<double>());
  EXPECT_GT(two["head_bytes"].get<double>(), 0.0);  // the vocabulary-parallel head's slice
  // The bound: within 10% of the measured peak (on the AMX host where this was written,
  // to the byte).
  EXPECT_NEAR(one["total_bytes"].get<double>() / measured[0], 1.0, 0.10) << measured[0];
  EXPECT_NEAR(two["total_bytes"].get<double>() / measured[1], 1.0, 0.10) << measured[1];
  // Sequence parallelism: the residual stream is split too (half the rows on each of 2 ranks),
  // and the whole is smaller again; within 10% of what the sp run measured.
  const nlohmann::json two_sp = trainer(sp);
  EXPECT_TRUE(two_sp["sequence_parallel"].get<bool>());
  EXPECT_EQ(two_sp["residual_bytes"].get<double>() * 2, one["residual_bytes"].get<double>());
  EXPECT_LT(two_sp["total_bytes"].get<double>(), two["total_bytes"].get<double>());
  EXPECT_LT(measured[2], measured[1]);
  EXPECT_NEAR(two_sp["total_bytes"].get<double>() / measured[2], 1.0, 0.10) << measured[2];
  // The text report says the figure is one tp rank's.
  const auto text = run_lattice("estimate memory --config tp1.toml --parallelism.tp=2", dir_);
  ASSERT_EQ(text.status, 0) << text.out << text.err;
  EXPECT_NE(text.out.find("tp 2): activations peak"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("MiB per rank"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace lattice::train
