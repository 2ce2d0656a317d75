// `lattice data tokenizer`: trains a byte-level BPE tokenizer (GPT-2's pre-tokenizer, special
// tokens such as <|endoftext|>) on text files and writes it as a Hugging Face tokenizer.json that
// `data prepare`, `train` and `generate` (and tiktoken / HF tokenizers) read.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/bpe_trainer.hpp"
#include "lattice/data/byte_corpus.hpp"
#include "lattice/data/tokenizer.hpp"
#include "lattice/data/tokenizer_files.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_data_tokenizer(CLI::App& data) {
  struct Options {
    std::vector<std::string> inputs;
    std::vector<std::string> exclude = {"*.dat", "*.u8"};
    std::string out;
    data::BpeTrainerOptions trainer;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = data.add_subcommand(
      "tokenizer", "Train a byte-level BPE tokenizer on text files (writes a tokenizer.json)");
  cmd->add_option("--input", o->inputs, "Text files or glob patterns (quoted)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--exclude", o->exclude, "File names to skip (default: *.dat *.u8)")
      ->expected(0, -1);
  cmd->add_option("--vocab-size", o->trainer.vocab_size,
                  "Target vocabulary: 256 bytes + merges + special tokens")
      ->capture_default_str();
  cmd->add_option("--special", o->trainer.special_tokens,
                  "Special tokens, given the last ids (default: <|endoftext|>)")
      ->expected(0, -1);
  cmd->add_option("--min-frequency", o->trainer.min_frequency,
                  "Pairs seen fewer times are not merged")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Output tokenizer.json path")->required();
  cmd->callback([o] {
    check(o->trainer.min_frequency >= 1, "--min-frequency must be at least 1");
    const auto start = std::chrono::steady_clock::now();
    data::BpeTrainer trainer(o->trainer);
    std::vector<std::filesystem::path> files;
    for (const auto& f : data::expand_file_patterns(o->inputs, o->exclude, "--input"))
      files.emplace_back(f);
    trainer.add_files(files);
    const bool terminal = ::isatty(STDERR_FILENO) != 0;
    const data::BpeModel model = trainer.train([terminal](int64_t done, int64_t wanted) {
      if (!terminal) return;
      std::fprintf(stderr, "\rtokenizer: %lld of %lld merges", static_cast<long long>(done),
                   static_cast<long long>(wanted));
      std::fflush(stderr);
    });
    if (terminal) std::fprintf(stderr, "\n");
    const std::filesystem::path out(o->out);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    data::write_tokenizer_json(model, out);
    // Read it back through the loader every consumer uses, so what we report is what they get.
    const auto tokenizer = data::load_tokenizer(out.string());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("trained %s on %zu files (%lld pieces) in %.1f s: vocabulary %lld -> %s\n",
                tokenizer->name().c_str(), files.size(),
                static_cast<long long>(trainer.pieces_counted()), seconds,
                static_cast<long long>(tokenizer->vocab_size()), out.string().c_str());
  });
}

}  // namespace lattice::cli
