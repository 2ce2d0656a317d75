// The `lattice generate` verb: sample text from a checkpoint with a KV cache, through the tokenizer
// the model was trained with (--tokenizer, else data.tokenizer of the checkpoint's config.toml,
// else "byte"), printing each token as soon as it completes a UTF-8 character.
#include <omp.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/generator.hpp"
#include "verbs.hpp"

namespace lattice::cli {

// The tokenizer spec recorded as data.tokenizer in the checkpoint's config.toml, or "byte" when the
// checkpoint has no config.toml or the key is absent.
std::string recorded_tokenizer(const std::string& checkpoint_dir) {
  const std::filesystem::path path = std::filesystem::path(checkpoint_dir) / "config.toml";
  if (!std::filesystem::exists(path)) return "byte";
  toml::table config;
  try {
    config = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    throw Error(path.string() + " is not valid TOML (" + std::string(e.description()) +
                "): repair it or name the tokenizer with --tokenizer");
  }
  const toml::node* node = config["data"]["tokenizer"].node();
  if (node == nullptr) return "byte";
  check(node->is_string(), path.string() +
                               ": data.tokenizer must be a string: repair it or name the tokenizer "
                               "with --tokenizer");
  return node->as_string()->get();
}

namespace {

// The prompt's ids: `prompt` encoded (special tokens such as <|endoftext|> allowed). An empty
// prompt starts from the end-of-text token (printed as nothing), or from a newline for a tokenizer
// without one (and `prompt` becomes "\n", printed as the old byte-level verb did).
std::vector<int32_t> prompt_tokens(const data::Tokenizer& tokenizer, std::string& prompt) {
  if (prompt.empty()) {
    if (auto end = tokenizer.end_of_text()) return {*end};
    prompt = "\n";
  }
  std::vector<int32_t> ids = tokenizer.encode(prompt, true);
  check(!ids.empty(), "the prompt encodes to no token: give a longer --prompt");
  return ids;
}

}  // namespace

void register_generate_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand("generate", "Sample text from a trained checkpoint");
  struct Options {
    std::string checkpoint, prompt, tokenizer, logits_out;
    int threads = 0;
    int64_t stop_token = -1;
    train::SamplingSettings sampling;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--checkpoint", o->checkpoint, "checkpoint directory, or a run directory")
      ->required();
  verb->add_option("--prompt", o->prompt, "prompt text (default: read from stdin when piped)");
  verb->add_option("--tokenizer", o->tokenizer,
                   "tokenizer spec (default: data.tokenizer in the checkpoint's config.toml, else "
                   "byte)");
  verb->add_option("--max-tokens", o->sampling.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  verb->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  verb->add_option("--top-k", o->sampling.top_k, "keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  verb->add_option("--top-p", o->sampling.top_p, "nucleus sampling mass (1 = off)")
      ->capture_default_str();
  verb->add_option("--seed", o->sampling.seed, "sampling seed")->capture_default_str();
  CLI::Option* stop_option = verb->add_option(
      "--stop-token", o->stop_token,
      "stop at this token id (default: the tokenizer's end-of-text token; -1 = never stop early)");
  verb->add_option("--threads", o->threads, "kernel threads (0 = every core)")
      ->capture_default_str();
  verb->add_option("--logits-out", o->logits_out,
                   "also write the prompt's tokens, the full forward's logits [T, vocab] and the "
                   "generated tokens to this safetensors file (for comparisons with other "
                   "implementations)");
  verb->callback([o, stop_option] {
    check(o->threads >= 0, "--threads must not be negative");
    if (o->threads > 0) omp_set_num_threads(o->threads);
    check(o->sampling.max_new_tokens >= 0, "--max-tokens must not be negative");
    check(o->sampling.temperature >= 0, "--temperature must not be negative (0 = greedy)");
    check(o->sampling.top_k >= 0, "--top-k must not be negative (0 = off)");
    check(o->sampling.top_p > 0 && o->sampling.top_p <= 1, "--top-p must be in (0, 1]");
    const std::string dir = train::resolve_checkpoint(o->checkpoint);
    const model::ModelConfig config = train::read_checkpoint_model_config(dir);

    const std::string spec = o->tokenizer.empty() ? recorded_tokenizer(dir) : o->tokenizer;
    const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(spec);
    check(tokenizer->vocab_size() <= config.vocab_size,
          "tokenizer '" + spec + "' has " + std::to_string(tokenizer->vocab_size()) +
              " tokens but the checkpoint's model has a vocabulary of " +
              std::to_string(config.vocab_size) +
              ": pass the tokenizer the model was trained with (--tokenizer)");
    o->sampling.vocab_limit = tokenizer->vocab_size();  // never sample a padding id
    if (stop_option->count() > 0) {
      check(o->stop_token >= -1 && o->stop_token < tokenizer->vocab_size(),
            "--stop-token must be -1 (never) or an id below the tokenizer's vocabulary of " +
                std::to_string(tokenizer->vocab_size()));
      o->sampling.stop_token = static_cast<int32_t>(o->stop_token);
    } else {
      o->sampling.stop_token = tokenizer->end_of_text().value_or(-1);
    }

    model::Transformer model(config, nullptr);
    train::load_checkpoint(dir, model, nullptr);
    std::string prompt = o->prompt;
    if (prompt.empty() && !isatty(0))
      prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    std::vector<int32_t> tokens = prompt_tokens(*tokenizer, prompt);

    kernels::CpuOps ops;
    std::vector<float> prompt_logits;
    if (!o->logits_out.empty()) {
      const auto T = static_cast<int64_t>(tokens.size());
      check(T <= config.max_seq_len, "--logits-out: the prompt has " + std::to_string(T) +
                                         " tokens, more than the model's max_seq_len of " +
                                         std::to_string(config.max_seq_len) +
                                         ": give a shorter --prompt");
      model::LayerContext ctx{ops, kernels::Precision::fp32, nullptr};
      const float* logits = model.logits(ctx, tokens.data(), 1, T);
      prompt_logits.assign(logits, logits + T * config.vocab_size);
    }
    const std::vector<int32_t> prompt_ids = tokens;
    std::vector<int32_t> generated;
    data::StreamingDecoder decoder(*tokenizer);
    const auto print = [](const std::string& text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
    print(prompt);
    const int32_t stop = o->sampling.stop_token;
    const train::GenerationStats stats =
        train::generate(model, ops, tokens, o->sampling, [&](int32_t token) {
          generated.push_back(token);
          if (token != stop) print(decoder.push(token));  // the stop token is not printed
        });
    print(decoder.flush() + "\n");
    if (!o->logits_out.empty()) {
      const auto T = static_cast<int64_t>(prompt_ids.size());
      std::vector<SafetensorsEntry> entries = {
          {"tokens", DType::i32, {T}, prompt_ids.data(), prompt_ids.size() * sizeof(int32_t)},
          {"logits",
           DType::f32,
           {T, config.vocab_size},
           prompt_logits.data(),
           prompt_logits.size() * sizeof(float)}};
      if (!generated.empty())
        entries.push_back({"generated",
                           DType::i32,
                           {static_cast<int64_t>(generated.size())},
                           generated.data(),
                           generated.size() * sizeof(int32_t)});
      write_safetensors(o->logits_out, entries);
    }
    std::fprintf(stderr, "%s\n", stats.summary().c_str());
  });
}

}  // namespace lattice::cli
