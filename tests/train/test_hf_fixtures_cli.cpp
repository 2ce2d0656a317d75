// What the newest transformers saves, checked in every CI run without transformers: the committed
// fixtures of tests/reference/hf_fixtures (one tiny random model per family Lattice imports —
// GPT-2, Llama, scaled-RoPE Llamas (llama3, yarn), Mistral with its sliding window, Qwen 2, Qwen 3,
// Qwen3-MoE, Mixtral, DeepSeek-V3 (with and without its query rank, interleaved rope rows, groups
// and yarn) — saved by transformers 5.x's save_pretrained with F32, BF16 or F16 weights,
// in one file or sharded, with transformers' logits; tests/reference/make_hf_fixtures.py writes
// them) import through `lattice import` with transformers' logits, and an fp32 export of the
// imported run imports again as the same model, logit for logit. DeepSeek-V3's multi-token-
// prediction layers are reported and left out.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/io/safetensors.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(LATTICE_SOURCE_DIR) / "tests/reference/hf_fixtures";

std::vector<float> read_logits(const fs::path& file, int64_t n) {
  lattice::SafetensorsFile f(file.string());
  std::vector<float> values(static_cast<size_t>(n));
  f.read_f32("logits", values.data(), n);
  return values;
}

// The largest |logit| of `theirs` and the largest difference of `ours` from it.
struct LogitDifference {
  double scale = 0, diff = 0;
};
LogitDifference logit_difference(const std::vector<float>& ours, const std::vector<float>& theirs) {
  LogitDifference d;
  for (size_t i = 0; i < ours.size(); ++i) {
    d.scale = std::max(d.scale, static_cast<double>(std::fabs(theirs[i])));
    d.diff = std::max(d.diff, static_cast<double>(std::fabs(ours[i] - theirs[i])));
  }
  return d;
}

class HfFixturesCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Lattice's logits of `prompt` (byte tokens) from run `run`.
  std::vector<float> logits(const std::string& run, const std::string& prompt) {
    const std::string file = run + ".logits";
    const CliResult r = run_lattice("generate --checkpoint " + run + " --prompt '" + prompt +
                                        "' --max-tokens 0 --threads 1 --logits-out " + file,
                                    dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return read_logits(dir_ / file, static_cast<int64_t>(prompt.size()) * 256);
  }

  fs::path dir_;
};

}  // namespace

TEST_F(HfFixturesCli, EveryFamilyImportsWithTransformersLogitsAndExportsBackUnchanged) {
  const nlohmann::json manifest =
      nlohmann::json::parse(slurp(kFixtures / "fixtures.json")).at("fixtures");
  ASSERT_GE(manifest.size(), 11u);
  for (const auto& [kind, fixture] : manifest.items()) {
    SCOPED_TRACE(kind + " (" + fixture.at("dtype").get<std::string>() + ")");
    const std::string prompt = fixture.at("prompt").get<std::string>();
    const fs::path saved = kFixtures / kind;
    EXPECT_EQ(fs::exists(saved / "model.safetensors.index.json"),
              fixture.at("sharded").get<bool>());
    const std::string run = "imported-" + kind;
    const CliResult imported =
        run_lattice("import --format hf " + saved.string() + " --run-dir " + run, dir_);
    ASSERT_EQ(imported.status, 0) << imported.out << imported.err;
    // transformers' fp32 logits of the weights as saved (a BF16 or F16 file holds exactly the
    // values it computed with) against Lattice's fp32 logits: the same operations in another
    // order (fused kernels here, eager PyTorch there), relative 1e-5 of the largest logit.
    const std::vector<float> ours = logits(run, prompt);
    const std::vector<float> theirs =
        read_logits(saved / "reference_logits.safetensors", static_cast<int64_t>(ours.size()));
    const auto [scale, diff] = logit_difference(ours, theirs);
    EXPECT_GT(scale, 0.5);  // far from uniform: the comparison means something
    EXPECT_LE(diff, 1e-5 * scale) << "max difference " << diff << " of " << scale;
    // Exported (fp32) and imported again: the same config and the same weights, so the same
    // logits bit for bit.
    const CliResult exported =
        run_lattice("export --format hf --checkpoint " + run + " exported-" + kind, dir_);
    ASSERT_EQ(exported.status, 0) << exported.out << exported.err;
    const std::string again = "reimported-" + kind;
    const CliResult reimported =
        run_lattice("import --format hf exported-" + kind + " --run-dir " + again, dir_);
    ASSERT_EQ(reimported.status, 0) << reimported.out << reimported.err;
    EXPECT_EQ(logits(again, prompt), ours);
  }
}

// Weights that do not fit the config, or of a dtype Lattice does not import: one line each, and
// nothing in the run directory. The qwen3 fixture (one F32 file) rewritten with one tensor changed.
TEST_F(HfFixturesCli, WrongWeightsAreOneLineAndWriteNothing) {
  const fs::path fixture = kFixtures / "qwen3";
  lattice::SafetensorsFile original((fixture / "model.safetensors").string());
  // Every tensor in fp32, so that one can be dropped, added or stored as another dtype.
  std::vector<std::vector<float>> values;
  std::vector<lattice::SafetensorsEntry> entries;
  for (const std::string& name : original.names()) {
    const lattice::SafetensorsEntry& e = original.entry(name);
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    values.emplace_back(static_cast<size_t>(n));
    original.read_f32(name, values.back().data(), n);
    entries.push_back({name, lattice::DType::f32, e.shape, values.back().data(),
                       static_cast<size_t>(n) * sizeof(float), 0});
  }
  const std::string victim = "model.layers.0.self_attn.q_norm.weight";
  std::vector<int32_t> integers(16, 1);
  const auto variant = [&](const std::string& name, auto&& change) {
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    fs::copy_file(fixture / "config.json", dir / "config.json");
    std::vector<lattice::SafetensorsEntry> changed = entries;
    change(changed);
    lattice::write_safetensors((dir / "model.safetensors").string(), changed, {{"format", "pt"}});
    return dir.string();
  };
  const auto erase = [&](std::vector<lattice::SafetensorsEntry>& v) {
    std::erase_if(v, [&](const auto& e) { return e.name == victim; });
  };
  const std::pair<std::string, std::string> cases[] = {
      {variant("missing", erase), "lacks the weight '" + victim + "'"},
      {variant("extra",
               [&](auto& v) {
                 auto e = v.front();
                 e.name = "model.layers.0.self_attn.q_bias";
                 v.push_back(e);
               }),
       "has the weight 'model.layers.0.self_attn.q_bias'"},
      {variant("integer",
               [&](auto& v) {
                 erase(v);
                 v.push_back({victim,
                              lattice::DType::i32,
                              {16},
                              integers.data(),
                              integers.size() * sizeof(int32_t),
                              0});
               }),
       "'" + victim + "' is i32; Lattice imports F32, BF16 and F16 weights"}};
  for (const auto& [dir, needle] : cases) {
    SCOPED_TRACE(dir);
    expect_one_error_line(
        run_lattice("import " + dir + " --run-dir run-" + fs::path(dir).filename().string(), dir_),
        needle);
    EXPECT_FALSE(fs::exists(dir_ / ("run-" + fs::path(dir).filename().string())));
  }
}

// DeepSeek-V3's checkpoints carry num_nextn_predict_layers multi-token-prediction layers after the
// model's (model.layers.61.* of the 61-layer model), which transformers does not load: the import
// reports them in one line and imports the rest, with transformers' logits; a config that
// declares none makes the same weights extra, refused in one line with nothing written.
TEST_F(HfFixturesCli, DeepSeekPredictionLayersAreReportedAndLeftOut) {
  const fs::path fixture = kFixtures / "deepseek_v3";
  const auto with_prediction_layer = [&](const std::string& name, int64_t declared) {
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    for (const auto& entry : fs::directory_iterator(fixture))
      if (entry.path().filename() != "model.safetensors.index.json")
        fs::copy_file(entry.path(), dir / entry.path().filename());
    // Layer 3 of the 3-layer model: two weights of DeepSeek's MTP module, in a file of their own.
    std::vector<float> values(48 * 96, 0.25f);
    const std::vector<lattice::SafetensorsEntry> mtp = {{"model.layers.3.eh_proj.weight",
                                                         lattice::DType::f32,
                                                         {48, 96},
                                                         values.data(),
                                                         values.size() * sizeof(float),
                                                         0},
                                                        {"model.layers.3.enorm.weight",
                                                         lattice::DType::f32,
                                                         {48},
                                                         values.data(),
                                                         48 * sizeof(float),
                                                         0}};
    lattice::write_safetensors((dir / "mtp.safetensors").string(), mtp, {{"format", "pt"}});
    nlohmann::json index = nlohmann::json::parse(slurp(fixture / "model.safetensors.index.json"));
    for (const auto& e : mtp) index["weight_map"][e.name] = "mtp.safetensors";
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
    nlohmann::json config = nlohmann::json::parse(slurp(fixture / "config.json"));
    config["num_nextn_predict_layers"] = declared;
    std::ofstream(dir / "config.json") << config.dump(2);
    return dir.string();
  };
  const CliResult imported =
      run_lattice("import " + with_prediction_layer("with-mtp", 1) + " --run-dir run-mtp", dir_);
  ASSERT_EQ(imported.status, 0) << imported.out << imported.err;
  EXPECT_NE(imported.out.find("note: 2 weights of the multi-token-prediction layer(s) "
                              "model.layers.3.* are not imported"),
            std::string::npos)
      << imported.out;
  const std::string prompt = nlohmann::json::parse(
      slurp(kFixtures / "fixtures.json"))["fixtures"]["deepseek_v3"]["prompt"];
  const std::vector<float> ours = logits("run-mtp", prompt);
  const std::vector<float> theirs =
      read_logits(fixture / "reference_logits.safetensors", static_cast<int64_t>(ours.size()));
  const auto [scale, diff] = logit_difference(ours, theirs);
  EXPECT_LE(diff, 1e-5 * scale);  // as the fixture test: the MTP weights changed nothing
  expect_one_error_line(
      run_lattice("import " + with_prediction_layer("undeclared", 0) + " --run-dir run-undeclared",
                  dir_),
      "has the weight 'model.layers.3.e");
  EXPECT_FALSE(fs::exists(dir_ / "run-undeclared"));
}
