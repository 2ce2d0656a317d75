// Tests of generation: the KV-cached generator against the greedy argmax of the full forward
// (prompts shorter and longer than the window, a window that slides), its stop token, seeds, top-k
// and vocabulary limit; and `lattice generate` end to end on a tiny trained checkpoint (prompt from
// --prompt or stdin, the stop token, the tokenizer recorded in the checkpoint, and bad input as one
// error line with exit status 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/data/bpe_model.hpp"
#include "lattice/data/tokenizer_files.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/generator.hpp"

using namespace lattice;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// gpt2-tiny / llama-tiny (max_seq_len 32, vocabulary 64) with weights large enough that logits
// are far from ties.
model::ModelConfig tiny(model::Family family) {
  model::ModelConfig c =
      model::model_preset(family == model::Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.init_std = 0.2f;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return tokens;
}

// The reference: greedy decoding with the full forward (Transformer::logits) over the generator's
// documented window, without a cache. The context starts as the prompt's last max_seq_len tokens;
// when it would exceed max_seq_len it restarts from the last max_seq_len / 2 tokens.
std::vector<int32_t> greedy_full_forward(model::Transformer& model, std::vector<int32_t> tokens,
                                         int64_t new_tokens) {
  kernels::CpuOps ops;
  model::LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
  const int64_t capacity = model.config().max_seq_len, V = model.config().vocab_size;
  int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - capacity);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t size = static_cast<int64_t>(tokens.size());
    if (size - start > capacity) start = size - capacity / 2;
    const int64_t window = size - start;
    const float* logits = model.logits(ctx, tokens.data() + start, 1, window);
    const float* last = logits + (window - 1) * V;
    const auto next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    tokens.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

std::vector<int32_t> run_generator(model::Transformer& model, std::vector<int32_t> tokens,
                                   const train::SamplingSettings& settings,
                                   train::GenerationStats* stats = nullptr) {
  kernels::CpuOps ops;
  std::vector<int32_t> emitted;
  train::GenerationStats s = train::generate(model, ops, tokens, settings,
                                             [&](int32_t token) { emitted.push_back(token); });
  EXPECT_EQ(static_cast<int64_t>(emitted.size()), s.generated_tokens);
  EXPECT_TRUE(std::equal(emitted.begin(), emitted.end(), tokens.end() - emitted.size()));
  if (stats) *stats = s;
  return emitted;
}

class Generator : public ::testing::TestWithParam<model::Family> {
 protected:
  Generator() : model_(tiny(GetParam()), nullptr) { model_.initialize(3); }
  model::Transformer model_;
};

}  // namespace

TEST_P(Generator, GreedyEqualsTheArgmaxOfTheFullForwardTokenByToken) {
  const int64_t capacity = model_.config().max_seq_len, V = model_.config().vocab_size;
  train::SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 2 * capacity;  // slides at least twice
  for (int64_t prompt_length : {int64_t{1}, int64_t{5}, capacity + 8}) {
    SCOPED_TRACE("prompt of " + std::to_string(prompt_length) + " tokens");
    const std::vector<int32_t> prompt = random_tokens(prompt_length, V, 40 + prompt_length);
    train::GenerationStats stats;
    const std::vector<int32_t> cached = run_generator(model_, prompt, greedy, &stats);
    EXPECT_EQ(cached, greedy_full_forward(model_, prompt, greedy.max_new_tokens));
    EXPECT_EQ(stats.prompt_tokens, std::min(prompt_length, capacity));
    EXPECT_GE(stats.window_slides, 2);
    EXPECT_EQ(stats.generated_tokens, greedy.max_new_tokens);
  }
}

TEST_P(Generator, StopsRightAfterTheStopToken) {
  train::SamplingSettings settings;
  settings.max_new_tokens = 30;
  settings.seed = 9;
  const std::vector<int32_t> prompt = random_tokens(4, model_.config().vocab_size, 2);
  const std::vector<int32_t> free_run = run_generator(model_, prompt, settings);
  // The first token whose first occurrence is at index >= 3.
  size_t stop_at = 3;
  while (std::find(free_run.begin(), free_run.begin() + stop_at, free_run[stop_at]) !=
         free_run.begin() + stop_at)
    ++stop_at;
  settings.stop_token = free_run[stop_at];
  const std::vector<int32_t> stopped = run_generator(model_, prompt, settings);
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + stop_at + 1));
}

TEST_P(Generator, SamplingIsSeededAndHonoursTopKAndTheVocabularyLimit) {
  const int64_t V = model_.config().vocab_size;
  const std::vector<int32_t> prompt = random_tokens(6, V, 8);
  train::SamplingSettings settings;
  settings.max_new_tokens = 40;
  settings.temperature = 1.5f;
  settings.seed = 5;
  const std::vector<int32_t> a = run_generator(model_, prompt, settings);
  EXPECT_EQ(a, run_generator(model_, prompt, settings));  // same seed, same tokens
  settings.seed = 6;
  EXPECT_NE(a, run_generator(model_, prompt, settings));
  // top-k = 1 (and a tiny nucleus) leave only the most likely token: greedy.
  const std::vector<int32_t> greedy = greedy_full_forward(model_, prompt, 40);
  settings.top_k = 1;
  EXPECT_EQ(run_generator(model_, prompt, settings), greedy);
  settings.top_k = 0;
  settings.top_p = 1e-6f;
  EXPECT_EQ(run_generator(model_, prompt, settings), greedy);
  // Ids at or above vocab_limit are never drawn.
  settings.top_p = 1.0f;
  settings.vocab_limit = 7;
  for (int32_t token : run_generator(model_, prompt, settings)) EXPECT_LT(token, 7);
}

INSTANTIATE_TEST_SUITE_P(Families, Generator,
                         ::testing::Values(model::Family::gpt2, model::Family::llama),
                         [](const auto& info) { return model::family_name(info.param); });

namespace {

// A byte-level BPE tokenizer of 259 ids: the 256 bytes, "th" (256), "the" (257) and <|endoftext|>
// (258), written as a Hugging Face tokenizer.json.
void write_small_bpe_tokenizer(const fs::path& path) {
  data::BpeModel bpe;
  for (int b = 0; b < 256; ++b) bpe.tokens.push_back({std::string(1, static_cast<char>(b)), b});
  bpe.tokens.push_back({"th", 256});
  bpe.tokens.push_back({"the", 257});
  bpe.merges = {{"t", "h"}, {"th", "e"}};
  bpe.special_tokens.push_back({"<|endoftext|>", 258});
  data::write_tokenizer_json(bpe, path);
}

// Saves a gpt2-tiny checkpoint with a padded vocabulary of 320 whose next-token logits are the same
// after every prefix: the final LayerNorm's weight is 0 and its bias the unit vector e0, so the
// logit of id v is wte[v][0]. Id 300 (padding beyond the tokenizer's 259 ids) gets 20, the
// end-of-text token 258 gets 10, every other id 0. config.toml records the tokenizer.
void save_rigged_checkpoint(const fs::path& run_dir, const std::string& tokenizer_spec) {
  model::ModelConfig config = model::model_preset("gpt2-tiny");
  config.vocab_size = 320;
  model::Transformer model(config, nullptr);
  model.initialize(1);
  auto& params = model.parameters();
  float* wte = params.mutable_value(params.index_of("transformer.wte.weight"));
  for (int64_t v = 0; v < config.vocab_size; ++v) wte[v * config.d_model] = 0.0f;
  wte[300 * config.d_model] = 20.0f;
  wte[258 * config.d_model] = 10.0f;
  float* norm_weight = params.mutable_value(params.index_of("transformer.ln_f.weight"));
  float* norm_bias = params.mutable_value(params.index_of("transformer.ln_f.bias"));
  for (int64_t c = 0; c < config.d_model; ++c) norm_weight[c] = norm_bias[c] = 0.0f;
  norm_bias[0] = 1.0f;
  kernels::CpuOps adamw_ops;
  optim::AdamWOptimizer optimizer(adamw_ops, params, {}, nullptr);
  train::save_checkpoint(run_dir.string(), model, optimizer, {},
                         "[data]\ntokenizer = '" + tokenizer_spec + "'\n", 1);
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains gpt2-tiny (byte vocabulary, max_seq_len 32) for 60 steps into dir_/run (a fraction
  // of a second on one thread) on a repetitive corpus.
  void train_tiny_run() {
    {
      std::ofstream corpus(dir_ / "corpus.txt");
      for (int i = 0; i < 100; ++i)
        corpus << "The quick brown fox jumps over the lazy dog.\nA stitch in time saves nine.\n";
    }
    const CliResult r = run_lattice(
        "train --job.run_dir=run --model.preset=gpt2-tiny --model.vocab_size=256"
        " --model.max_seq_len=32 --training.seq_len=32 --training.micro_batch_size=4"
        " --training.threads=1 --training.precision=fp32 --optimizer.lr=3e-3"
        " --lr_scheduler.warmup_steps=2 --data.train_files=corpus.txt --data.val_fraction=0.1"
        " --validation.freq=0 --metrics.log_freq=100 --metrics.peak_tflops=1 --training.steps=60",
        dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }

  void expect_error(const std::string& args, const std::string& needle) {
    expect_one_error_line(run_lattice(args, dir_), needle);
  }

  fs::path dir_;
};

}  // namespace

TEST_F(GenerateCli, PromptFromTheArgumentOrStdinPrintsPromptAndTokensAndReportsTheRate) {
  ASSERT_NO_FATAL_FAILURE(train_tiny_run());
  const std::string sampling = " --max-tokens 40 --seed 3 --threads 1";
  const CliResult from_argument =
      run_lattice("generate --checkpoint run --prompt 'The quick'" + sampling, dir_);
  ASSERT_EQ(from_argument.status, 0) << from_argument.err;
  // Byte tokenizer (recorded in the run's config.toml): the prompt, 40 bytes, a newline. 40 tokens
  // past a 9-token prompt overflow the 32-position window, so the cache slides once.
  EXPECT_EQ(from_argument.out.rfind("The quick", 0), 0u);
  EXPECT_EQ(from_argument.out.size(), 9u + 40u + 1u);
  EXPECT_NE(from_argument.err.find("generated 40 tokens"), std::string::npos) << from_argument.err;
  EXPECT_NE(from_argument.err.find("tokens/s"), std::string::npos);
  EXPECT_NE(from_argument.err.find("slid 1 times"), std::string::npos) << from_argument.err;
  EXPECT_EQ(count_lines(from_argument.err), 1) << from_argument.err;

  std::ofstream(dir_ / "prompt.txt") << "The quick";
  const CliResult from_stdin =
      run_lattice("generate --checkpoint run" + sampling, dir_, "prompt.txt");
  ASSERT_EQ(from_stdin.status, 0) << from_stdin.err;
  EXPECT_EQ(from_stdin.out, from_argument.out);
}

TEST_F(GenerateCli, StopTokenEndsTheOutputAndIsNotPrinted) {
  ASSERT_NO_FATAL_FAILURE(train_tiny_run());
  // Seeded sampling: the tokens before the stop are the same draws with or without it.
  const std::string sample =
      "generate --checkpoint run --prompt 'The ' --temperature 1 --seed 4 --max-tokens 24"
      " --threads 1";
  const CliResult full = run_lattice(sample, dir_);
  ASSERT_EQ(full.status, 0) << full.err;
  ASSERT_EQ(full.out.size(), 4u + 24u + 1u);
  const std::string generated = full.out.substr(4, 24);
  // Stop at the first byte that was not generated before it, from index 2 on.
  size_t stop_at = 2;
  while (stop_at < generated.size() && generated.find(generated[stop_at]) < stop_at) ++stop_at;
  ASSERT_LT(stop_at, generated.size()) << generated;
  const int stop_byte = static_cast<unsigned char>(generated[stop_at]);
  const CliResult stopped =
      run_lattice(sample + " --stop-token " + std::to_string(stop_byte), dir_);
  ASSERT_EQ(stopped.status, 0) << stopped.err;
  EXPECT_EQ(stopped.out, "The " + generated.substr(0, stop_at) + "\n");
  EXPECT_NE(stopped.err.find("generated " + std::to_string(stop_at + 1) + " tokens"),
            std::string::npos)
      << stopped.err;
}

TEST_F(GenerateCli, UsesTheTokenizerRecordedInTheCheckpointUnlessOneIsGiven) {
  ASSERT_NO_FATAL_FAILURE(train_tiny_run());
  const fs::path checkpoint = train::resolve_checkpoint((dir_ / "run").string());
  const std::string config = slurp(checkpoint / "config.toml");
  const std::string recorded = "tokenizer = 'byte'";
  ASSERT_NE(config.find(recorded), std::string::npos) << config;
  std::string edited = config;
  edited.replace(edited.find(recorded), recorded.size(), "tokenizer = 'no-such-tokenizer.json'");
  std::ofstream(checkpoint / "config.toml") << edited;
  expect_error("generate --checkpoint run --max-tokens 4", "no-such-tokenizer.json");
  const CliResult overridden =
      run_lattice("generate --checkpoint run --tokenizer byte --max-tokens 4 --prompt x", dir_);
  EXPECT_EQ(overridden.status, 0) << overridden.err;
  EXPECT_EQ(overridden.out.size(), 1u + 4u + 1u);
  std::ofstream(checkpoint / "config.toml") << "[data\ntokenizer = 3\n";
  expect_error("generate --checkpoint run --max-tokens 4", "is not valid TOML");
}

TEST_F(GenerateCli, BadArgumentsAreOneErrorLine) {
  expect_error("generate --checkpoint nowhere", "checkpoint nowhere does not exist");
  ASSERT_NO_FATAL_FAILURE(train_tiny_run());
  expect_error("generate --checkpoint run --top-p 0", "--top-p must be in (0, 1]");
  expect_error("generate --checkpoint run --top-p 1.5", "--top-p must be in (0, 1]");
  expect_error("generate --checkpoint run --temperature -1", "--temperature must not be negative");
  expect_error("generate --checkpoint run --stop-token 256", "--stop-token must be -1");
}

// A tokenizer with more ids than the model's vocabulary: the 256-id byte tokenizer against
// gpt2-tiny's 64, and the 259-id BPE tokenizer against a vocabulary of 256.
TEST_F(GenerateCli, ATokenizerLargerThanTheModelVocabularyIsRefused) {
  for (int64_t vocab : {64, 256}) {
    model::ModelConfig config = model::model_preset("gpt2-tiny");
    config.vocab_size = vocab;
    model::Transformer model(config, nullptr);
    model.initialize(1);
    kernels::CpuOps adamw_ops;
    optim::AdamWOptimizer optimizer(adamw_ops, model.parameters(), {}, nullptr);
    train::save_checkpoint((dir_ / ("vocab" + std::to_string(vocab))).string(), model, optimizer,
                           {}, "", 1);
  }
  expect_error("generate --checkpoint vocab64",
               "tokenizer 'byte' has 256 tokens but the checkpoint's model has a vocabulary of 64: "
               "pass the tokenizer the model was trained with (--tokenizer)");
  write_small_bpe_tokenizer(dir_ / "tokenizer.json");
  expect_error("generate --checkpoint vocab256 --tokenizer tokenizer.json",
               "tokenizer 'tokenizer.json' has 259 tokens but the checkpoint's model has a "
               "vocabulary of 256");
  EXPECT_EQ(run_lattice("generate --checkpoint vocab256 --max-tokens 3", dir_).status, 0);
}

TEST_F(GenerateCli, EndOfTextStopsUnprintedAndPaddingIdsAreNeverSampled) {
  write_small_bpe_tokenizer(dir_ / "tokenizer.json");
  save_rigged_checkpoint(dir_ / "run", (dir_ / "tokenizer.json").string());
  // Greedy would pick padding id 300 (logit 20) without the tokenizer's limit; within it the
  // end-of-text token wins and ends the generation at once. The prompt is printed as given.
  const CliResult greedy =
      run_lattice("generate --checkpoint run --prompt 'the thé' --temperature 0", dir_);
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_EQ(greedy.out, "the thé\n");
  EXPECT_NE(greedy.err.find("generated 1 tokens"), std::string::npos) << greedy.err;
  // Never stopping early: the end-of-text token decodes to its text.
  const CliResult no_stop = run_lattice(
      "generate --checkpoint run --prompt the --temperature 0 --stop-token -1 --max-tokens 2",
      dir_);
  ASSERT_EQ(no_stop.status, 0) << no_stop.err;
  EXPECT_EQ(no_stop.out, "the<|endoftext|><|endoftext|>\n");
  // An empty prompt starts from the end-of-text token, which is not printed.
  const CliResult empty = run_lattice("generate --checkpoint run --temperature 0", dir_);
  ASSERT_EQ(empty.status, 0) << empty.err;
  EXPECT_EQ(empty.out, "\n");
  // Sampling: id 300 holds ~99.99% of the mass; were it drawn, decoding would fail.
  const CliResult sampled = run_lattice(
      "generate --checkpoint run --prompt the --temperature 1 --stop-token -1 --max-tokens 64",
      dir_);
  EXPECT_EQ(sampled.status, 0) << sampled.err;
}
