// The `lattice export` and `lattice import` verbs: a checkpoint of any layout written as a Hugging
// Face model directory, and such a directory read as the step-0 checkpoint of a new run
// (train/hf_format.hpp).
#include <cstdio>
#include <filesystem>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/hf_format.hpp"
#include "verbs.hpp"

namespace lattice::cli {

namespace {

void check_format(const std::string& format) {
  check(format == "hf", "--format " + format + " is not known: use --format hf (Hugging Face)");
}

}  // namespace

void register_export_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "export", "Write a checkpoint (any layout) as a Hugging Face model directory");
  struct Options {
    std::string format = "hf", checkpoint, out, tokenizer;
    double max_shard_mb = 5000, memory_limit_mb = 0;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--format", o->format, "hf (config.json, safetensors, tokenizer files)")
      ->capture_default_str();
  verb->add_option("--checkpoint", o->checkpoint, "checkpoint directory, or a run directory")
      ->required();
  verb->add_option("OUT,--out", o->out, "the directory to create")->required();
  verb->add_option("--max-shard-mb", o->max_shard_mb,
                   "largest safetensors file; above it the weights are split with an index")
      ->capture_default_str();
  verb->add_option("--memory-limit-mb", o->memory_limit_mb,
                   "memory the export may hold at once (0: the host's available memory)")
      ->capture_default_str();
  verb->add_option("--tokenizer", o->tokenizer,
                   "tokenizer to include (default: data.tokenizer of the checkpoint's config.toml; "
                   "byte: none)");
  verb->callback([o] {
    check_format(o->format);
    const std::string dir = train::resolve_checkpoint(o->checkpoint);
    const std::string tokenizer = o->tokenizer.empty() ? recorded_tokenizer(dir) : o->tokenizer;
    const train::HfExportSummary s =
        train::export_hf(dir, o->out, static_cast<int64_t>(o->max_shard_mb * 1024 * 1024),
                         tokenizer, static_cast<int64_t>(o->memory_limit_mb * 1024 * 1024));
    std::printf(
        "exported %s to %s: %lld tensors, %.1f MB in %d safetensors file%s%s%s\n", dir.c_str(),
        o->out.c_str(), static_cast<long long>(s.tensors), s.bytes / 1e6, s.files,
        s.files == 1 ? "" : "s",
        s.tokenizer.empty() ? "; no tokenizer files" : "; tokenizer: ", s.tokenizer.c_str());
  });
}

void register_import_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "import", "Start a run from a Hugging Face model directory (its step-0 checkpoint)");
  struct Options {
    std::string format = "hf", dir, run_dir;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--format", o->format, "hf (what save_pretrained writes)")
      ->capture_default_str();
  verb->add_option("DIR", o->dir, "the Hugging Face model directory")->required();
  verb->add_option("--run-dir", o->run_dir, "the new run's directory")->required();
  verb->callback([o] {
    check_format(o->format);
    const model::ModelConfig config = train::import_hf(o->dir, o->run_dir);
    const std::string toml = (std::filesystem::path(o->run_dir) / "import.toml").string();
    std::printf(
        "imported %s (%s, %lld layers, d_model %lld) as the step-0 checkpoint of %s\n"
        "train from it: lattice train %s --data.dataset=... (settings in that file)\n",
        o->dir.c_str(), config.name.c_str(), static_cast<long long>(config.n_layers),
        static_cast<long long>(config.d_model), o->run_dir.c_str(), toml.c_str());
  });
}

}  // namespace lattice::cli
