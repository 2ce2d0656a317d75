// The `lattice export` and `lattice import` verbs: a checkpoint of any layout written as a Hugging
// Face model directory (fp32, bf16 or fp16, with the run's tokenizer and its special-token ids),
// and such a directory read as the step-0 checkpoint of a new run that takes its tokenizer along
// (train/hf_format.hpp).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/hf_format.hpp"
#include "verbs.hpp"

namespace lattice::cli {

namespace {

void check_format(const std::string& format) {
  check(format == "hf", "--format " + format + " is not known: use --format hf (Hugging Face)");
}

// The weights' dtype of `--dtype`.
DType export_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::f16;
  throw Error("--dtype " + name + " is not known: use fp32, bf16 or fp16");
}

std::string id_text(const std::optional<int32_t>& id) {
  return id ? std::to_string(*id) : std::string("none");
}

}  // namespace

void register_export_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "export", "Write a checkpoint (any layout) as a Hugging Face model directory");
  struct Options {
    std::string format = "hf", checkpoint, out, tokenizer, dtype = "fp32";
    double max_shard_mb = 5000, memory_limit_mb = 0;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--format", o->format,
                   "hf (config.json, safetensors, tokenizer files, generation_config.json)")
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
                   "tokenizer to include, its bos/eos/pad ids in config.json and "
                   "generation_config.json (default: data.tokenizer of the checkpoint's "
                   "config.toml; byte: none)");
  verb->add_option("--dtype", o->dtype,
                   "weights' dtype: fp32, bf16 or fp16 (rounded to nearest even; fp16 refuses "
                   "values beyond +-65504)")
      ->capture_default_str();
  verb->callback([o] {
    check_format(o->format);
    const DType dtype = export_dtype(o->dtype);
    const std::string dir = train::resolve_checkpoint(o->checkpoint);
    const std::string tokenizer = o->tokenizer.empty() ? recorded_tokenizer(dir) : o->tokenizer;
    const train::HfExportSummary s =
        train::export_hf(dir, o->out, static_cast<int64_t>(o->max_shard_mb * 1024 * 1024),
                         tokenizer, static_cast<int64_t>(o->memory_limit_mb * 1024 * 1024), dtype);
    std::printf(
        "exported %s to %s: %lld tensors, %.1f MB of %s in %d safetensors file%s%s%s\n",
        dir.c_str(), o->out.c_str(), static_cast<long long>(s.tensors), s.bytes / 1e6,
        std::string(dtype_name(s.dtype)).c_str(), s.files, s.files == 1 ? "" : "s",
        s.tokenizer.empty() ? "; no tokenizer files" : "; tokenizer: ", s.tokenizer.c_str());
  });
}

void register_import_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "import", "Start a run from a Hugging Face model directory (its step-0 checkpoint)");
  struct Options {
    std::string format = "hf", dir, run_dir;
    bool no_tokenizer = false;
  };
  auto o = std::make_shared<Options>();
  verb->add_option("--format", o->format, "hf (what save_pretrained writes)")
      ->capture_default_str();
  verb->add_option("DIR", o->dir,
                   "the Hugging Face model directory (its tokenizer files are copied to "
                   "RUN_DIR/tokenizer and become the run's data.tokenizer)")
      ->required();
  verb->add_option("--run-dir", o->run_dir, "the new run's directory")->required();
  verb->add_flag("--no-tokenizer", o->no_tokenizer,
                 "leave DIR's tokenizer files (tokenizer.json, or vocab.json + merges.txt) out: "
                 "the run uses the byte tokenizer");
  verb->callback([o] {
    check_format(o->format);
    const train::HfImportSummary s = train::import_hf(o->dir, o->run_dir, !o->no_tokenizer);
    const model::ModelConfig& config = s.config;
    const std::string toml = (std::filesystem::path(o->run_dir) / "import.toml").string();
    std::printf("imported %s (%s, %lld layers, d_model %lld) as the step-0 checkpoint of %s\n",
                o->dir.c_str(), config.name.c_str(), static_cast<long long>(config.n_layers),
                static_cast<long long>(config.d_model), o->run_dir.c_str());
    for (const std::string& line : s.ignored) std::printf("note: %s\n", line.c_str());
    if (s.tokenizer.empty()) {
      std::printf(o->no_tokenizer ? "tokenizer of %s left out (--no-tokenizer): the run uses the "
                                    "byte tokenizer\n"
                                  : "no tokenizer found in %s (no tokenizer.json, nor vocab.json "
                                    "+ merges.txt): the run uses the byte tokenizer\n",
                  o->dir.c_str());
    } else {
      std::printf("tokenizer: %s copied to %s (%s, end-of-text %s), data.tokenizer of the run\n",
                  s.tokenizer_files.c_str(), s.tokenizer.c_str(), s.tokenizer_name.c_str(),
                  id_text(s.end_of_text).c_str());
      if (s.declared_eos && s.declared_eos != s.end_of_text)
        std::printf(
            "note: transformers stops generating at eos_token_id %d, lattice generate at the "
            "end-of-text token (%s): pass --stop-token %d to lattice generate to stop where "
            "transformers does\n",
            *s.declared_eos, id_text(s.end_of_text).c_str(), *s.declared_eos);
    }
    std::printf(
        "train from it: lattice train %s --data.dataset=... (settings in that file), or with a "
        "config of your own: checkpoint.init_from = \"%s\" (configs/finetune.toml)\n",
        toml.c_str(), o->run_dir.c_str());
  });
}

}  // namespace lattice::cli
