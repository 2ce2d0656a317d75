// The tokenizer and the dtype of Hugging Face interop without transformers (train/hf_format.hpp,
// train/hf_tokenizer.hpp): an export with GPT-2's tokenizer names its end-of-text token (50256,
// as GPT-2's own config.json does) as bos and eos in config.json and generation_config.json, and
// the pad token special_tokens_map.json names as pad; an import copies the directory's tokenizer
// files into the run and points data.tokenizer at the copy, which loads and encodes "Hello world"
// as GPT-2's 15496 995, and reports an eos_token_id of config.json that is not the tokenizer's
// end-of-text token; a tokenizer larger than the model's vocabulary, or one that does not parse, is
// refused before anything is written; a bf16 export holds the fp32 export's values rounded to
// nearest even.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/hf_format.hpp"

using namespace lattice;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kGpt2 = LATTICE_TESTDATA_DIR "/gpt2";

class HfTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice-hf-tokenizer-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A step-0 checkpoint of gpt2-tiny with `vocab_size` tokens (random weights) in run `name`.
  std::string checkpoint(const std::string& name, int64_t vocab_size) {
    model::ModelConfig config = model::model_preset("gpt2-tiny");
    config.vocab_size = vocab_size;
    config.max_seq_len = 32;
    model::Transformer model(config, nullptr);
    model.initialize(5);
    kernels::CpuOps ops;
    optim::AdamWOptimizer adamw(ops, model.parameters(), optim::AdamWSettings{}, nullptr);
    return train::save_checkpoint(path(name), model, adamw, {0, 0, 1}, "", 1);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  json read_json(const std::string& name) const { return json::parse(read_file_text(path(name))); }
  std::string error_of(const std::function<void()>& action) const {
    try {
      action();
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path dir_;
};

TEST_F(HfTokenizer, ExportNamesTheEndOfTextTokenAndImportTakesTheTokenizer) {
  const std::string run = checkpoint("run", 50257);
  train::export_hf(run, path("hf"), 1 << 30, kGpt2);
  const json config = read_json("hf/config.json"),
             generation = read_json("hf/generation_config.json");
  // What GPT-2's own config.json on the Hub says: bos = eos = 50256 (<|endoftext|>), no pad.
  EXPECT_EQ(config["bos_token_id"], 50256);
  EXPECT_EQ(config["eos_token_id"], 50256);
  EXPECT_TRUE(config["pad_token_id"].is_null());
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["dtype"], "float32");
  EXPECT_EQ(generation,
            json({{"_from_model_config", true}, {"bos_token_id", 50256}, {"eos_token_id", 50256}}));

  const train::HfImportSummary imported = train::import_hf(path("hf"), path("imported"));
  EXPECT_EQ(imported.tokenizer,
            fs::absolute(path("imported/tokenizer")).lexically_normal().string());
  EXPECT_EQ(imported.tokenizer_files, "vocab.json, merges.txt");
  EXPECT_EQ(imported.end_of_text, 50256);
  EXPECT_EQ(imported.declared_eos, 50256);
  for (const char* name : {"vocab.json", "merges.txt"})
    EXPECT_EQ(read_file_text(path(std::string("imported/tokenizer/") + name)),
              read_file_text(path(std::string("hf/") + name)))
        << name;
  // data.tokenizer names the copy, in import.toml and in the checkpoint's own config.toml (what
  // `lattice generate` and `lattice export` read).
  const std::string line = "tokenizer = '" + imported.tokenizer + "'";
  EXPECT_NE(read_file_text(path("imported/import.toml")).find(line), std::string::npos);
  const std::string step0 = train::latest_checkpoint(path("imported"));
  EXPECT_NE(read_file_text(step0 + "/config.toml").find(line), std::string::npos);
  const auto tokenizer = data::load_tokenizer(imported.tokenizer);
  EXPECT_EQ(tokenizer->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer->end_of_text(), 50256);

  // --no-tokenizer, and a directory without tokenizer files: the byte tokenizer, as before.
  const train::HfImportSummary bare = train::import_hf(path("hf"), path("bare"), false);
  EXPECT_TRUE(bare.tokenizer.empty());
  EXPECT_FALSE(fs::exists(path("bare/tokenizer")));
  EXPECT_NE(read_file_text(path("bare/import.toml")).find("tokenizer = 'byte'"), std::string::npos);
}

TEST_F(HfTokenizer, APadTokenAndAnotherEosAreReadFromTheHuggingFaceFiles) {
  // special_tokens_map.json beside vocab.json names the pad token: its id goes to config.json and
  // generation_config.json, and the file goes along.
  const std::string run = checkpoint("run", 50257);
  fs::create_directories(path("tok"));
  fs::copy_file(kGpt2 + "/encoder.json", path("tok/vocab.json"));
  fs::copy_file(kGpt2 + "/vocab.bpe", path("tok/merges.txt"));
  std::ofstream(path("tok/special_tokens_map.json"))
      << R"({"eos_token": "<|endoftext|>", "pad_token": {"content": "<|endoftext|>"}})";
  const train::HfExportSummary exported = train::export_hf(run, path("hf"), 1 << 30, path("tok"));
  EXPECT_EQ(exported.tokenizer, "vocab.json, merges.txt, special_tokens_map.json");
  EXPECT_EQ(read_json("hf/config.json")["pad_token_id"], 50256);
  EXPECT_EQ(read_json("hf/generation_config.json")["pad_token_id"], 50256);
  // A directory whose config.json names another eos than the tokenizer's end-of-text token: the
  // import reports both (the verb prints the --stop-token to pass).
  fs::remove(path("hf/generation_config.json"));
  json config = read_json("hf/config.json");
  config["eos_token_id"] = json::array({7, 50256});
  std::ofstream(path("hf/config.json")) << config.dump(2);
  const train::HfImportSummary imported = train::import_hf(path("hf"), path("imported"));
  EXPECT_EQ(imported.tokenizer_files, "vocab.json, merges.txt, special_tokens_map.json");
  EXPECT_EQ(imported.declared_eos, 7);
  EXPECT_EQ(imported.end_of_text, 50256);
  EXPECT_TRUE(fs::exists(path("imported/tokenizer/special_tokens_map.json")));
}

TEST_F(HfTokenizer, ATokenizerTheEmbeddingCannotServeIsRefusedBeforeAnythingIsWritten) {
  const std::string run = checkpoint("small", 256);
  // Export: GPT-2's 50257 tokens for a model of 256.
  std::string message =
      error_of([&] { train::export_hf(run, path("hf-refused"), 1 << 30, kGpt2); });
  EXPECT_NE(message.find("has 50257 tokens but the model's vocab_size is 256"), std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(path("hf-refused")));
  // Import: the same files beside a 256-token model's weights.
  train::export_hf(run, path("hf"), 1 << 30, "byte");
  EXPECT_FALSE(fs::exists(path("hf/generation_config.json")));  // no tokenizer, no ids
  fs::copy_file(kGpt2 + "/encoder.json", path("hf/vocab.json"));
  fs::copy_file(kGpt2 + "/vocab.bpe", path("hf/merges.txt"));
  message = error_of([&] { train::import_hf(path("hf"), path("r1")); });
  EXPECT_NE(message.find("has 50257 tokens but the model's vocab_size is 256"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--no-tokenizer"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path("r1")));
  // A tokenizer.json that does not parse (it comes before vocab.json + merges.txt).
  std::ofstream(path("hf/tokenizer.json")) << "{\"model\": ";
  message = error_of([&] { train::import_hf(path("hf"), path("r2")); });
  EXPECT_NE(message.find("the tokenizer does not load"), std::string::npos) << message;
  EXPECT_NE(message.find("tokenizer.json: not valid JSON"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path("r2")));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST_F(HfTokenizer, Bf16AndF16ExportsHoldTheFp32ValuesRounded) {
  const std::string run = checkpoint("run", 256);
  train::export_hf(run, path("f32"), 1 << 30, "byte");
  train::export_hf(run, path("b16"), 1 << 30, "byte", 0, DType::bf16);
  train::export_hf(run, path("h16"), 1 << 30, "byte", 0, DType::f16);
  EXPECT_EQ(read_json("b16/config.json")["torch_dtype"], "bfloat16");
  EXPECT_EQ(read_json("b16/config.json")["dtype"], "bfloat16");
  EXPECT_EQ(read_json("h16/config.json")["torch_dtype"], "float16");
  SafetensorsFile f32(path("f32/model.safetensors")), b16(path("b16/model.safetensors")),
      h16(path("h16/model.safetensors"));
  ASSERT_EQ(f32.names(), b16.names());
  ASSERT_EQ(f32.names(), h16.names());
  for (const std::string& name : f32.names()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(b16.entry(name).dtype, DType::bf16);
    EXPECT_EQ(h16.entry(name).dtype, DType::f16);
    EXPECT_EQ(b16.entry(name).shape, f32.entry(name).shape);
    const int64_t n = shape_numel(f32.entry(name).shape);
    std::vector<float> exact(static_cast<size_t>(n)), brain(exact.size()), half(exact.size());
    f32.read_f32(name, exact.data(), n);
    b16.read_f32(name, brain.data(), n);
    h16.read_f32(name, half.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // Rounded to nearest: within half a unit in the last place (bf16 keeps 8 significant bits,
      // so at most 2^-8 of the value; f16 11 bits, 2^-11, for its normal values).
      ASSERT_LE(std::fabs(brain[i] - exact[i]), std::ldexp(std::fabs(exact[i]), -8)) << i;
      if (std::fabs(exact[i]) >= 0x1p-14f)
        ASSERT_LE(std::fabs(half[i] - exact[i]), std::ldexp(std::fabs(exact[i]), -11)) << i;
      ASSERT_EQ(brain[i], round_to_bf16(exact[i])) << i;
    }
  }
}

}  // namespace
