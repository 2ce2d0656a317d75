// The `lattice generate` verb: sample text from a checkpoint (byte-level tokens).
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/generator.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_generate_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand("generate", "Sample text from a trained checkpoint");
  struct Options {
    std::string checkpoint, prompt;
    int threads = 0;
    train::SamplingSettings sampling;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--checkpoint", o->checkpoint, "checkpoint directory, or a run directory")
      ->required();
  verb->add_option("--prompt", o->prompt, "prompt text (default: read from stdin when piped)");
  verb->add_option("--max-tokens", o->sampling.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  verb->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  verb->add_option("--top-k", o->sampling.top_k, "keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  verb->add_option("--top-p", o->sampling.top_p, "nucleus sampling mass (1 = off)")
      ->capture_default_str();
  verb->add_option("--seed", o->sampling.seed, "sampling seed")->capture_default_str();
  verb->add_option("--threads", o->threads, "kernel threads (0 = every core)")
      ->capture_default_str();
  verb->callback([o] {
    check(o->threads >= 0, "--threads must not be negative");
    if (o->threads > 0) omp_set_num_threads(o->threads);
    check(o->sampling.max_new_tokens >= 0, "--max-tokens must not be negative");
    check(o->sampling.top_p > 0 && o->sampling.top_p <= 1, "--top-p must be in (0, 1]");
    const std::string dir = train::resolve_checkpoint(o->checkpoint);
    model::ModelConfig config = train::read_checkpoint_model_config(dir);
    check(config.vocab_size >= 256, "this checkpoint's vocabulary is not byte-level");
    model::Transformer model(config, nullptr);
    train::load_checkpoint(dir, model, nullptr);
    std::string prompt = o->prompt;
    if (prompt.empty() && !isatty(0))
      prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (prompt.empty()) prompt = "\n";
    std::vector<int32_t> tokens;
    for (unsigned char c : prompt) tokens.push_back(c);
    kernels::MatmulEngine matmul;
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    train::generate(model, matmul, tokens, o->sampling, [](int32_t token) {
      std::fputc(token < 256 ? token : '?', stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
  });
}

}  // namespace lattice::cli
