// Hugging Face interop through the CLI (issue #25): `lattice export --format hf` of GPT-2, Llama
// and Mixtral checkpoints loads in `transformers` (tests/reference/hf_interop.py, from the venv
// scripts/install_deps.sh makes) with Lattice's logits on the same tokens (`generate
// --logits-out`); an export of a pipeline run is the one-rank run's export byte for byte, and
// exports of tensor- and expert-parallel runs hold every weight; `lattice import --format hf` reads
// what transformers' save_pretrained wrote (sharded, with its index) with transformers' logits, and
// a run trains from it; bad input is one line and leaves nothing behind. Every check in
// transformers runs in each venv that is present: transformers 4.46.3 and 5.x (whose config.json
// holds RoPE in rope_parameters); Llamas with RoPE scaling (llama3, linear, dynamic, yarn) import
// with transformers' logits past the original context and export back with the same. A GPT-2 run
// trained on GPT-2's tokenizer exports with it (bos = eos = <|endoftext|> in config.json and
// generation_config.json) and transformers' greedy generate makes the tokens `lattice generate`
// makes and stops where it stops, also from the export imported back (its tokenizer taken along);
// bf16 and fp16 exports hold the fp32 export's weights as torch rounds them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "lattice/io/safetensors.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// The interpreters with transformers that scripts/install_deps.sh prepares: 4.46.3 over Debian's
// torch (LATTICE_HF_VENV) and 5.x over PyPI's torch 2.x (LATTICE_HF5_VENV). Those that cannot
// import transformers are left out, with a line saying so.
std::vector<std::string> hf_pythons() {
  std::vector<std::string> found;
  const std::pair<const char*, const char*> venvs[] = {
      {"LATTICE_HF_VENV", "/opt/lattice/hf-venv"}, {"LATTICE_HF5_VENV", "/opt/lattice/hf5-venv"}};
  for (const auto& [variable, fallback] : venvs) {
    const char* venv = std::getenv(variable);
    const std::string python = std::string(venv ? venv : fallback) + "/bin/python";
    if (std::system((python + " -c 'import transformers' > /dev/null 2>&1").c_str()) == 0)
      found.push_back(python);
    else
      std::cout << "[ skipped  ] " << python << " cannot import transformers (" << variable
                << "): its checks do not run\n";
  }
  return found;
}

const char* const kPrompt = "Hello world, this is";
// 64 tokens, four times the scaled models' original context of 16.
const char* const kLongPrompt = "The quick brown fox jumps over the lazy dog, then sleeps. The qu";

std::string byte_tokens(const std::string& text) {
  std::string tokens;
  for (const char c : text) tokens += " " + std::to_string(static_cast<int>(c));
  return tokens;
}

const std::string kGpt2Tokenizer = LATTICE_TESTDATA_DIR "/gpt2";

// The text after "`key`: " on its line of `report` ("" when there is none).
std::string report_field(const std::string& report, const std::string& key) {
  const size_t at = report.find("\n" + key + ": ");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 3;
  return report.substr(begin, report.find('\n', begin) - begin);
}

// The model_type of the config.json in `dir`.
std::string model_type_of(const fs::path& dir) {
  const std::string config = slurp(dir / "config.json");
  const std::string key = "\"model_type\": \"";
  const size_t at = config.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return config.substr(begin, config.find('"', begin) - begin);
}

class HfCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_small_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs tests/reference/hf_interop.py under `python` with `args`; its output in `out`.
  int interop(const std::string& python, const std::string& args, std::string& out) const {
    const fs::path log = dir_ / "interop.log";
    const std::string command = python +
                                " '" LATTICE_SOURCE_DIR "/tests/reference/hf_interop.py' " + args +
                                " > '" + log.string() + "' 2>&1";
    const int raw = std::system(command.c_str());
    out = slurp(log);
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  }
  CliResult train(const std::string& preset, const std::string& run, const std::string& extra) {
    return run_lattice("train --model.preset=" + preset +
                           " --model.vocab_size=256 --model.max_seq_len=32 --training.seq_len=32"
                           " --training.global_batch_size=8 --training.threads=1"
                           " --training.steps=8 --optimizer.lr=1e-2 --lr_scheduler.warmup_steps=1"
                           " --data.train_files=corpus.txt --data.val_fraction=0.1"
                           " --validation.freq=0 --metrics.log_freq=100 --job.run_dir=" +
                           run + " " + extra,
                       dir_);
  }
  // A gpt2-tiny run on GPT-2's tokenizer (vocabulary 50257): 300 documents "Hello world. The cat
  // sat.", each after <|endoftext|> (what `data prepare` puts between documents), learnt in
  // `steps` steps well enough that greedy generation from "Hello" ends the sentence and then emits
  // <|endoftext|>.
  void train_gpt2_tokenized(const std::string& run, int steps) {
    {
      std::ofstream out(dir_ / "sentences.txt");
      for (int i = 0; i < 300; ++i) out << "Hello world. The cat sat.\n%\n";
    }
    const CliResult p = run_lattice(
        "data prepare --input sentences.txt --separator '\\n%\\n'"
        " --val-fraction 0.05 --tokenizer " +
            kGpt2Tokenizer + " --out gpt2-data",
        dir_);
    ASSERT_EQ(p.status, 0) << p.out << p.err;
    const CliResult r = run_lattice(
        "train --model.preset=gpt2-tiny --model.vocab_size=50257 --model.max_seq_len=32"
        " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
        " --training.steps=" +
            std::to_string(steps) +
            " --optimizer.lr=1e-2 --lr_scheduler.warmup_steps=1 --data.dataset=gpt2-data"
            " --validation.freq=0 --metrics.log_freq=100 --job.run_dir=" +
            run,
        dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  // Whether `python`'s transformers has models of `model_type` (Qwen 3's came in 4.51); prints a
  // line when it has not.
  bool knows(const std::string& python, const std::string& model_type) const {
    std::string report;
    if (interop(python, "has " + model_type, report) == 0) return true;
    std::cout << "[ skipped  ] " << python << " has no " << model_type << " models\n";
    return false;
  }
  // `python` makes a transformers model of `kind` in `hf` (tests/reference/hf_interop.py make,
  // with its logits on `tokens`), and `lattice import` reads it into the run `run`.
  void make_and_import(const std::string& python, const std::string& kind, const std::string& hf,
                       const std::string& run, const std::string& tokens) {
    std::string report;
    ASSERT_EQ(interop(python, "make " + kind + " " + (dir_ / hf).string() + tokens, report), 0)
        << report;
    const CliResult imported = run_lattice("import --format hf " + hf + " --run-dir " + run, dir_);
    ASSERT_EQ(imported.status, 0) << imported.out << imported.err;
    // transformers' make saves no tokenizer: the run uses bytes, and the import says so.
    EXPECT_NE(imported.out.find("no tokenizer found in " + hf), std::string::npos) << imported.out;
  }
  // Lattice's logits of `prompt` (byte tokens) from a checkpoint, in `file`, and its greedy
  // continuation of `greedy` tokens (KV-cached, never stopping early).
  void logits(const std::string& checkpoint, const std::string& file,
              const std::string& prompt = kPrompt, int greedy = 0) {
    const CliResult r = run_lattice("generate --checkpoint " + checkpoint + " --prompt '" + prompt +
                                        "' --max-tokens " + std::to_string(greedy) +
                                        " --temperature 0 --stop-token -1 --threads 1"
                                        " --logits-out " +
                                        file,
                                    dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  // Exports run `run` into `out` (small files: the index is written too) and checks it in
  // transformers against Lattice's logits. fp32 on both sides, the same operations in another
  // order (fused kernels here, eager PyTorch there): relative 1e-5 of the largest logit
  // (measured 2.6e-7 to 3.9e-7; the scaled-RoPE Llamas on 64 tokens 4e-7 to 5e-7). And `greedy`
  // tokens after the prompt, Lattice's KV-cached generation against transformers' generate: the
  // same ids.
  void expect_loads_in_transformers(const std::vector<std::string>& pythons, const std::string& run,
                                    const std::string& out, const std::string& prompt = kPrompt,
                                    int greedy = 8) {
    const CliResult e = run_lattice(
        "export --format hf --checkpoint " + run + " " + out + " --max-shard-mb 0.05", dir_);
    ASSERT_EQ(e.status, 0) << e.out << e.err;
    EXPECT_TRUE(fs::exists(dir_ / out / "model.safetensors.index.json")) << e.out;
    logits(run, run + ".logits", prompt, greedy);
    const std::string type = model_type_of(dir_ / out);
    for (const std::string& python : pythons) {
      SCOPED_TRACE(python);
      if (!knows(python, type)) continue;
      std::string report;
      EXPECT_EQ(interop(python,
                        "check " + (dir_ / out).string() + " " +
                            (dir_ / (run + ".logits")).string() + " 1e-5",
                        report),
                0)
          << report;
    }
  }
  // Lattice's logits of `prompt` from `run` against the transformers-saved model's own in `hf`:
  // fp32 both sides, another operation order: relative 1e-5 of the largest logit (measured 4e-7 to
  // 7e-7; 4e-7 to 5e-7 for the scaled-RoPE Llamas, which without their scaling are 14% to 50% off).
  void expect_transformers_logits(const std::string& run, const std::string& hf,
                                  const std::string& prompt) {
    logits(run, run + ".logits", prompt);
    lattice::SafetensorsFile ours((dir_ / (run + ".logits")).string()),
        theirs((dir_ / hf / "reference_logits.safetensors").string());
    const auto n = static_cast<int64_t>(prompt.size()) * 256;
    std::vector<float> a(static_cast<size_t>(n)), b(a.size());
    ours.read_f32("logits", a.data(), n);
    theirs.read_f32("logits", b.data(), n);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    }
    EXPECT_GT(scale, 0.5);  // far from uniform: the comparison means something
    EXPECT_LE(diff, 1e-5 * scale);
  }

  void expect_error(const std::string& args, const std::string& needle) {
    expect_one_error_line(run_lattice(args, dir_), needle);
  }

  fs::path dir_;
};

std::vector<char> bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_F(HfCli, ExportsLoadInTransformersWithLatticesLogits) {
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  // deepseek-v3-tiny keeps no choice bias: the export writes transformers' as zeros.
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny",
                             "qwen3-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(preset);
    const std::string run = std::string("run-") + preset;
    const CliResult r = train(preset, run, "");
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    expect_loads_in_transformers(pythons, run, std::string("hf-") + preset);
  }
}

TEST_F(HfCli, TheTokenizerGoesWithTheExportAndTransformersReadsIt) {
  // GPT-2's files (encoder.json + vocab.bpe) become vocab.json + merges.txt, byte for byte, and
  // config.json and generation_config.json name <|endoftext|> (50256) as bos and eos, as GPT-2's
  // own config.json does.
  train_gpt2_tokenized("run", 2);
  if (HasFatalFailure()) return;
  const std::string gpt2 = kGpt2Tokenizer;
  const CliResult e = run_lattice("export --checkpoint run hf --tokenizer " + gpt2, dir_);
  ASSERT_EQ(e.status, 0) << e.out << e.err;
  EXPECT_NE(e.out.find("tokenizer: vocab.json, merges.txt"), std::string::npos) << e.out;
  EXPECT_TRUE(bytes(dir_ / "hf/vocab.json") == bytes(fs::path(gpt2) / "encoder.json"));
  EXPECT_TRUE(bytes(dir_ / "hf/merges.txt") == bytes(fs::path(gpt2) / "vocab.bpe"));
  const auto config = nlohmann::json::parse(slurp(dir_ / "hf/config.json"));
  EXPECT_EQ(config["bos_token_id"], 50256);
  EXPECT_EQ(config["eos_token_id"], 50256);
  EXPECT_TRUE(config["pad_token_id"].is_null());
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_ / "hf/generation_config.json")),
            nlohmann::json(
                {{"_from_model_config", true}, {"bos_token_id", 50256}, {"eos_token_id", 50256}}));
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  for (const std::string& python : pythons) {
    std::string ids;
    ASSERT_EQ(interop(python, "tokenize " + (dir_ / "hf").string() + " 'Hello world'", ids), 0)
        << ids;
    EXPECT_NE(ids.find("15496 995"), std::string::npos) << ids;  // GPT-2's ids of "Hello world"
  }
}

TEST_F(HfCli, GreedyGenerationStopsWhereTransformersStops) {
  // Greedy decoding from "Hello" in transformers (model.generate, do_sample=False, with the
  // export's generation_config.json) and in `lattice generate --temperature 0`: the same prompt
  // ids, the same new tokens, and both stop at <|endoftext|> after the sentence (the stop token
  // counted, not printed). The export imported back takes its tokenizer and generates the same.
  train_gpt2_tokenized("run", 30);
  if (HasFatalFailure()) return;
  ASSERT_EQ(run_lattice("export --checkpoint run hf", dir_).status, 0);  // the run's tokenizer
  const CliResult imported = run_lattice("import hf --run-dir imported", dir_);
  ASSERT_EQ(imported.status, 0) << imported.out << imported.err;
  EXPECT_NE(imported.out.find("tokenizer: vocab.json, merges.txt copied to"), std::string::npos)
      << imported.out;
  EXPECT_EQ(imported.out.find("note:"), std::string::npos) << imported.out;  // the eos agrees
  const int max_new = 20;
  struct Generation {
    std::string text;
    int64_t tokens = 0;
  };
  const auto lattice_generate = [&](const std::string& checkpoint) {
    const CliResult r =
        run_lattice("generate --checkpoint " + checkpoint +
                        " --prompt Hello --temperature 0 --threads 1 --max-tokens " +
                        std::to_string(max_new) + " --logits-out " + checkpoint + ".logits",
                    dir_);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    const size_t count = r.err.find("generated ");  // "generated N tokens in ..."
    return Generation{r.out,
                      count == std::string::npos ? -1 : std::stoll(r.err.substr(count + 10))};
  };
  const Generation ours = lattice_generate("run");
  EXPECT_LT(ours.tokens, max_new) << ours.text;  // it stopped at <|endoftext|>
  const Generation again = lattice_generate("imported");
  EXPECT_EQ(again.text, ours.text);
  EXPECT_EQ(again.tokens, ours.tokens);
  lattice::SafetensorsFile prompt((dir_ / "run.logits").string());
  std::vector<int32_t> prompt_ids(static_cast<size_t>(prompt.entry("tokens").shape[0]));
  std::memcpy(prompt_ids.data(), prompt.entry("tokens").data, prompt_ids.size() * sizeof(int32_t));
  std::string prompt_text;
  for (const int32_t id : prompt_ids)
    prompt_text += (prompt_text.empty() ? "" : " ") + std::to_string(id);
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  for (const std::string& python : pythons) {
    SCOPED_TRACE(python);
    std::string report;
    ASSERT_EQ(
        interop(python, "generate " + (dir_ / "hf").string() + " Hello " + std::to_string(max_new),
                report),
        0)
        << report;
    EXPECT_EQ(report_field(report, "prompt ids"), prompt_text) << report;
    EXPECT_EQ(report_field(report, "eos"), "50256") << report;
    EXPECT_EQ(report_field(report, "stopped at eos"), "yes") << report;
    const std::string new_ids = report_field(report, "new ids");
    EXPECT_EQ(std::count(new_ids.begin(), new_ids.end(), ' ') + 1, ours.tokens) << report;
    const std::string text = report_field(report, "text");
    ASSERT_FALSE(text.empty()) << report;
    EXPECT_EQ("Hello" + nlohmann::json::parse(text).get<std::string>() + "\n", ours.text) << report;
  }
}

TEST_F(HfCli, Bf16AndFp16ExportsHoldTorchsRoundingOfTheWeights) {
  // transformers loads each export in the dtype its config.json names, and every parameter equals
  // the fp32 export's converted by torch (round to nearest even), bit for bit.
  ASSERT_EQ(train("llama-tiny", "run", "").status, 0);
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    const CliResult e =
        run_lattice(std::string("export --checkpoint run hf-") + dtype + " --dtype " + dtype, dir_);
    ASSERT_EQ(e.status, 0) << e.out << e.err;
  }
  EXPECT_NE(slurp(dir_ / "hf-bf16/config.json").find("\"torch_dtype\": \"bfloat16\""),
            std::string::npos);
  EXPECT_LT(fs::file_size(dir_ / "hf-bf16/model.safetensors"),
            fs::file_size(dir_ / "hf-fp32/model.safetensors") / 2 + 4096);
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  for (const std::string& python : pythons)
    for (const char* dtype : {"bf16", "fp16"}) {
      SCOPED_TRACE(python + " " + dtype);
      std::string report;
      EXPECT_EQ(interop(python,
                        "narrowed " + (dir_ / "hf-fp32").string() + " " +
                            (dir_ / (std::string("hf-") + dtype)).string(),
                        report),
                0)
          << report;
    }
}

TEST_F(HfCli, ExportsOfShardedRunsHoldEveryWeight) {
  // A pipeline run trains the one-rank run's bits (untied Llama), so its export is the same files.
  ASSERT_EQ(train("llama-tiny", "one", "").status, 0);
  const CliResult pipe = train("llama-tiny", "pipe", "--pp 2");
  ASSERT_EQ(pipe.status, 0) << pipe.out << pipe.err;
  for (const char* run : {"one", "pipe"})
    ASSERT_EQ(run_lattice(std::string("export --checkpoint ") + run + " hf-" + run, dir_).status,
              0);
  for (const char* file : {"config.json", "model.safetensors"})
    EXPECT_TRUE(bytes(dir_ / "hf-one" / file) == bytes(dir_ / "hf-pipe" / file)) << file;
  // Tensor- and expert-parallel runs: every weight of the model, the count the one-rank export
  // has, and transformers' logits equal Lattice's.
  const CliResult tp = train("llama-tiny", "tp", "--tp 2");
  ASSERT_EQ(tp.status, 0) << tp.out << tp.err;
  const CliResult ep = train("mixtral-tiny", "ep", "--dp 2 --parallelism.ep=2 --zero 1");
  ASSERT_EQ(ep.status, 0) << ep.out << ep.err;
  const CliResult count = run_lattice("export --checkpoint ep hf-ep-count", dir_);
  EXPECT_NE(count.out.find(": 41 tensors"), std::string::npos)
      << count.out;  // 2 layers x 4 experts
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  expect_loads_in_transformers(pythons, "tp", "hf-tp");
  expect_loads_in_transformers(pythons, "ep", "hf-ep");
}

TEST_F(HfCli, ImportsWhatTransformersSavedAndTrainsFromIt) {
  // Each family saved by each transformers imports with its logits, trains under tp x pp and
  // loads back. rope_theta 500000 (Llama 3's) in each: transformers 5 writes it inside
  // rope_parameters, and a base read as 10000 is about 1% off at position 20.
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  for (size_t v = 0; v < pythons.size(); ++v)
    for (const char* kind :
         {"gpt2", "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v3"}) {
      SCOPED_TRACE(pythons[v] + " " + kind);
      if (!knows(pythons[v], kind)) continue;  // the kinds are their model types
      const std::string suffix = std::string(kind) + "-" + std::to_string(v);
      const std::string hf = "saved-" + suffix, run = "imported-" + suffix;
      make_and_import(pythons[v], kind, hf, run, byte_tokens(kPrompt));
      if (HasFatalFailure()) return;
      EXPECT_TRUE(fs::exists(dir_ / hf / "model.safetensors.index.json"));  // sharded
      expect_transformers_logits(run, hf, kPrompt);
      // A run starts from the imported weights (step 0) with the settings import wrote, here
      // under tp 2 x pp 2, and its export loads in the same transformers with Lattice's logits.
      const CliResult trained =
          run_lattice("train " + run +
                          "/import.toml --data.train_files=corpus.txt --data.val_fraction=0.1"
                          " --training.seq_len=32 --training.steps=2 --training.threads=1"
                          " --parallelism.tp=2 --parallelism.pp=2 --optimizer.lr=1e-3"
                          " --validation.freq=0 --metrics.log_freq=1",
                      dir_);
      ASSERT_EQ(trained.status, 0) << trained.out << trained.err;
      EXPECT_NE(trained.out.find("resumed from " + run + "/checkpoints/step_00000000 at step 0"),
                std::string::npos)
          << trained.out;
      expect_loads_in_transformers({pythons[v]}, run, "trained-" + suffix);
    }
}

TEST_F(HfCli, ScaledRopeLlamasImportAndExportWithTransformersLogits) {
  // Each RoPE scaling type saved by each transformers (4.x: rope_scaling; 5.x: rope_parameters),
  // original context 16, compared on 64 tokens; then exported and loaded by every transformers.
  const std::vector<std::string> pythons = hf_pythons();
  if (pythons.empty()) GTEST_SKIP() << "no venv can import transformers";
  for (size_t v = 0; v < pythons.size(); ++v)
    for (const char* kind : {"llama3", "linear", "dynamic", "yarn"}) {
      SCOPED_TRACE(pythons[v] + " " + kind);
      const std::string suffix = std::string(kind) + "-" + std::to_string(v);
      const std::string hf = "saved-" + suffix, run = "imported-" + suffix;
      make_and_import(pythons[v], kind, hf, run, byte_tokens(kLongPrompt));
      if (HasFatalFailure()) return;
      const std::string config = slurp(dir_ / hf / "config.json");
      EXPECT_NE(config.find("\"" + std::string(kind) + "\""), std::string::npos) << config;
      EXPECT_NE(slurp(dir_ / run / "import.toml").find("rope_type = '" + std::string(kind) + "'"),
                std::string::npos);
      expect_transformers_logits(run, hf, kLongPrompt);
      // No greedy tokens: the prompt fills the model's 64 positions (Lattice's generation slides
      // its window beyond them, transformers' extrapolates), and dynamic's base depends on the
      // length (docs/io.md).
      expect_loads_in_transformers(pythons, run, "exported-" + suffix, kLongPrompt, 0);
    }
}

TEST_F(HfCli, FineTuningAnImportedModelWithConfigsFinetuneToml) {
  // The README's workflow on a transformers-saved Qwen 3 (the committed fixture, F32 weights):
  // import, configs/finetune.toml under tp 2 x pp 2 (the model and its weights from the
  // import, the learning rate, warmup and data from the config and its overrides), export, and
  // the export loads in transformers with Lattice's logits (where a venv has Qwen 3) and imports
  // back as the same model.
  const std::string saved = LATTICE_SOURCE_DIR "/tests/reference/hf_fixtures/qwen3";
  const CliResult imported = run_lattice("import " + saved + " --run-dir hf-import", dir_);
  ASSERT_EQ(imported.status, 0) << imported.out << imported.err;
  const CliResult trained =
      run_lattice("train " LATTICE_SOURCE_DIR
                  "/configs/finetune.toml --checkpoint.init_from=hf-import"
                  " --job.run_dir=finetune --data.dataset= --data.train_files=corpus.txt"
                  " --data.val_fraction=0.1 --validation.freq=0 --training.seq_len=32"
                  " --training.micro_batch_size=2 --training.steps=4 --training.precision=fp32"
                  " --training.threads=1 --parallelism.tp=2 --parallelism.pp=2 --optimizer.lr=1e-3"
                  " --lr_scheduler.warmup_steps=2 --metrics.log_freq=1",
                  dir_);
  ASSERT_EQ(trained.status, 0) << trained.out << trained.err;
  EXPECT_NE(trained.out.find("resumed from hf-import/checkpoints/step_00000000 at step 0"),
            std::string::npos)
      << trained.out;
  EXPECT_NE(trained.out.find("model qwen3-imported"), std::string::npos) << trained.out;
  // The schedule is the config's: linear warmup over 2 steps to lr 1e-3.
  const auto records = read_jsonl(dir_ / "finetune" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  EXPECT_NEAR(records[0].at("lr").get<double>(), 5e-4, 1e-9);
  EXPECT_NEAR(records[1].at("lr").get<double>(), 1e-3, 1e-9);
  // A [model] key that describes another model is refused: the import's is the model.
  expect_error("train " LATTICE_SOURCE_DIR
               "/configs/finetune.toml --checkpoint.init_from=hf-import --model.n_layers=3",
               "brings its model settings");
  // A trained run is continued (resume_from), not started from; and one of the two only.
  expect_error("train " LATTICE_SOURCE_DIR "/configs/finetune.toml --checkpoint.init_from=finetune",
               "is a step-4 checkpoint of a run: continue it with checkpoint.resume_from");
  expect_error("train " LATTICE_SOURCE_DIR
               "/configs/finetune.toml --checkpoint.init_from=hf-import"
               " --checkpoint.resume_from=finetune",
               "keep resume_from to continue a run, or init_from");
  const CliResult exported = run_lattice("export --checkpoint finetune finetune-hf", dir_);
  ASSERT_EQ(exported.status, 0) << exported.out << exported.err;
  logits("finetune", "finetune.logits");
  for (const std::string& python : hf_pythons()) {
    SCOPED_TRACE(python);
    if (!knows(python, "qwen3")) continue;
    std::string report;
    // fp32 both sides, another operation order: relative 1e-5 (as expect_loads_in_transformers).
    EXPECT_EQ(interop(python,
                      "check " + (dir_ / "finetune-hf").string() + " " +
                          (dir_ / "finetune.logits").string() + " 1e-5",
                      report),
              0)
        << report;
  }
  const CliResult again = run_lattice("import finetune-hf --run-dir reimported", dir_);
  ASSERT_EQ(again.status, 0) << again.out << again.err;
  logits("reimported", "reimported.logits");
  EXPECT_EQ(bytes(dir_ / "reimported.logits"), bytes(dir_ / "finetune.logits"));
  // Trained: the logits moved from the imported model's.
  logits("hf-import", "imported.logits");
  EXPECT_NE(bytes(dir_ / "imported.logits"), bytes(dir_ / "finetune.logits"));
}

TEST_F(HfCli, BadInputIsOneLineAndLeavesNothingBehind) {
  ASSERT_EQ(train("deepseek-moe-tiny", "deepseek", "").status, 0);
  expect_error("export --checkpoint deepseek hf-deepseek",
               "a DeepSeek-style MoE (model.moe_names) has no transformers equivalent");
  EXPECT_FALSE(fs::exists(dir_ / "hf-deepseek"));
  ASSERT_EQ(train("llama-tiny", "llama", "").status, 0);
  fs::create_directories(dir_ / "taken");
  expect_error("export --checkpoint llama taken", "taken already exists");
  expect_error("export --format onnx --checkpoint llama x", "--format onnx is not known");
  // An export that does not fit in memory at once (its one file, 0.15 MB, against a 0.1 MB limit).
  expect_error("export --checkpoint llama big --memory-limit-mb 0.1",
               "in memory at once (its largest file and tensor), more than the 0 MiB available: "
               "lower --max-shard-mb");
  EXPECT_FALSE(fs::exists(dir_ / "big"));
  // GPT-2's tokenizer (50257 tokens) for a model of 256; an unknown --dtype.
  expect_error("export --checkpoint llama hf-gpt2 --tokenizer " + kGpt2Tokenizer,
               "has 50257 tokens but the model's vocab_size is 256");
  EXPECT_FALSE(fs::exists(dir_ / "hf-gpt2"));
  expect_error("export --checkpoint llama hf-f8 --dtype f8", "--dtype f8 is not known");
  // Imports: no config.json, an unknown model type, a weight missing from the files.
  fs::create_directories(dir_ / "empty");
  expect_error("import empty --run-dir r1", "empty has no config.json");
  ASSERT_EQ(run_lattice("export --checkpoint llama hf-llama", dir_).status, 0);
  // A copy of the export whose config.json has `field` replaced by `value`.
  const auto edited = [&](const std::string& copy, const std::string& field,
                          const std::string& value) {
    std::string config = slurp(dir_ / "hf-llama/config.json");
    ASSERT_NE(config.find(field), std::string::npos) << config;
    fs::copy(dir_ / "hf-llama", dir_ / copy);
    config.replace(config.find(field), field.size(), value);
    std::ofstream(dir_ / copy / "config.json") << config;
  };
  edited("hf-bert", "\"model_type\": \"llama\"", "\"model_type\": \"bert\"");
  expect_error("import hf-bert --run-dir r2", "model_type \"bert\" cannot be imported");
  // One more layer than the weights hold.
  edited("hf-deeper", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
  expect_error("import hf-deeper --run-dir r3", "lacks the weight 'model.layers.2.");
  // A tokenizer larger than the vocabulary, and one that does not parse: refused before anything
  // is written.
  fs::copy(dir_ / "hf-llama", dir_ / "hf-big-tokenizer");
  fs::copy_file(kGpt2Tokenizer + "/encoder.json", dir_ / "hf-big-tokenizer/vocab.json");
  fs::copy_file(kGpt2Tokenizer + "/vocab.bpe", dir_ / "hf-big-tokenizer/merges.txt");
  expect_error("import hf-big-tokenizer --run-dir r4",
               "has 50257 tokens but the model's vocab_size is 256");
  fs::copy(dir_ / "hf-llama", dir_ / "hf-bad-tokenizer");
  std::ofstream(dir_ / "hf-bad-tokenizer/tokenizer.json") << "{\"model\": [";
  expect_error("import hf-bad-tokenizer --run-dir r5", "the tokenizer does not load");
  for (const char* run : {"r4", "r5"}) EXPECT_FALSE(fs::exists(dir_ / run)) << run;
  for (const char* run : {"r1", "r2", "r3"})
    EXPECT_FALSE(fs::exists(dir_ / run / "checkpoints")) << run;
}
