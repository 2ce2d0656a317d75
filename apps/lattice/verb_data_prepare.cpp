// `lattice data prepare`: tokenize text files into a directory of llm.c token shards with a
// manifest (train/validation split, documents separated by the end-of-text token, several encoder
// threads, a progress bar on stderr). The work is lattice::data::prepare_dataset.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "lattice/data/dataset_preparer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

// A one-line bar redrawn on stderr when it is a terminal; otherwise only the final line.
class ProgressBar {
 public:
  ProgressBar()
      : terminal_(::isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
  void update(int64_t done, int64_t total) {
    if (!terminal_ || total <= 0) return;
    const double fraction = static_cast<double>(done) / static_cast<double>(total);
    const double seconds = elapsed();
    const double eta = fraction > 0 ? seconds * (1 - fraction) / fraction : 0;
    const int width = 30, filled = static_cast<int>(fraction * width);
    std::fprintf(stderr, "\rprepare [%s%s] %3.0f%%  %.1f MB/s  ETA %.0fs ",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), 100 * fraction,
                 static_cast<double>(done) / 1e6 / std::max(seconds, 1e-3), eta);
    std::fflush(stderr);
  }
  void finish(int64_t total) {
    if (terminal_) std::fprintf(stderr, "\n");
    std::fprintf(stderr, "prepare: encoded %.1f MB of text in %.1f s\n",
                 static_cast<double>(total) / 1e6, elapsed());
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

void register_data_prepare(CLI::App& data) {
  auto options = std::make_shared<data::PrepareOptions>();
  auto separator = std::make_shared<std::string>();
  CLI::App* cmd = data.add_subcommand(
      "prepare", "Tokenize text files into llm.c token shards with a train/validation split");
  cmd->add_option("--input", options->inputs, "Text files or glob patterns (quoted)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--tokenizer", options->tokenizer,
                  "Tokenizer: \"byte\", a tokenizer.json, a directory, a .tiktoken file")
      ->required();
  cmd->add_option("--out", options->out, "Output directory (replaced whole when it is a dataset)")
      ->required();
  cmd->add_option("--exclude", options->exclude, "File names to skip (default: *.dat *.u8)")
      ->expected(0, -1);
  cmd->add_option("--separator", *separator,
                  "Text between documents inside a file, with \\n escapes (default: one "
                  "document per file), e.g. '\\n%\\n' for fortune files");
  cmd->add_option("--val-fraction", options->val_fraction,
                  "Share of documents in the validation split (default 0.05)");
  cmd->add_option("--shard-tokens", options->shard_tokens, "Tokens per shard (default 100000000)");
  cmd->add_option("--threads", options->threads, "Encoder threads (default: every core)");
  cmd->callback([options, separator] {
    options->separator = data::unescape_separator(*separator);
    ProgressBar bar;
    int64_t total = 0;
    const auto m = data::prepare_dataset(*options, [&](int64_t done, int64_t all) {
      total = all;
      bar.update(done, all);
    });
    bar.finish(total);
    std::printf(
        "prepared %s: %lld train tokens (%lld documents), %lld validation tokens (%lld "
        "documents), %zu shards of %s, tokenizer %s (vocabulary %lld)\n",
        options->out.c_str(), static_cast<long long>(m.train_tokens),
        static_cast<long long>(m.train_documents), static_cast<long long>(m.val_tokens),
        static_cast<long long>(m.val_documents), m.shards.size(), m.token_type.c_str(),
        m.tokenizer_name.c_str(), static_cast<long long>(m.vocab_size));
  });
}

}  // namespace lattice::cli
