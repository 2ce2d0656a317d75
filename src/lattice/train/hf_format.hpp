// Hugging Face interop: a checkpoint of any layout exported as a `transformers` model directory
// (config.json, model.safetensors or model-0000k-of-0000n.safetensors with
// model.safetensors.index.json above a size limit, and the tokenizer's files), and such a directory
// imported as a Lattice checkpoint to start a run from. The parameter names are the Hugging Face
// ones already (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM); what
// differs is the layout of GPT-2's Conv1D weights (c_attn, c_proj, c_fc: [in, out] there, [out, in]
// here), which is transposed both ways, and GPT-2's tied head, which Hugging Face stores only as
// the embedding. The config.json mapping is hf_config.hpp's, the tokenizer's files and
// special-token ids hf_tokenizer.hpp's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/train/hf_config.hpp"

namespace lattice::train {

// True for the GPT-2 weights that Hugging Face stores transposed (Conv1D).
bool hf_transposed(const model::ModelConfig& config, const std::string& name);

struct HfExportSummary {
  int64_t tensors = 0;       // weights written (every logical weight of the checkpoint)
  int64_t bytes = 0;         // their data bytes
  int files = 0;             // safetensors files
  std::string tokenizer;     // the tokenizer files copied ("" when the run had none to copy)
  DType dtype = DType::f32;  // of the weights written
};

// Writes the weights of the checkpoint `checkpoint_dir` (any layout) as a Hugging Face model
// directory `out_dir`, as `dtype` (F32, or BF16 / F16 rounded to nearest even from the fp32
// values; config.json's torch_dtype and dtype say which), in files of at most `max_shard_bytes`
// (one tensor larger than that gets a file of its own), with the tokenizer named by
// `tokenizer_spec` (a path to tokenizer.json, encoder.json / vocab.json, or a directory holding
// them; "byte" or "": none). With a tokenizer, config.json carries bos_token_id, eos_token_id and
// pad_token_id (hf_special_token_ids) and generation_config.json the same ids, so transformers'
// generate stops at the tokenizer's end-of-text token as `lattice generate` does; a tokenizer with
// more tokens than the model's vocab_size is refused. The directory is staged and renamed into
// place: an error leaves nothing at `out_dir`, and an existing `out_dir` is refused. Each tensor is
// read (and its pieces' checksums checked) one at a time. The export holds one file's tensors (and
// one tensor's fp32 copies) in memory at once: more than `memory_limit_bytes` (0: the host's
// available memory) is refused before anything is written.
HfExportSummary export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                          int64_t max_shard_bytes, const std::string& tokenizer_spec,
                          int64_t memory_limit_bytes = 0, DType dtype = DType::f32);

struct HfImportSummary {
  model::ModelConfig config;
  // The run's copy of the directory's tokenizer (an absolute path, data.tokenizer of the run's
  // settings), or "" when the directory has none and the run uses the byte tokenizer.
  std::string tokenizer;
  std::string tokenizer_files;          // their names, ", "-separated
  std::string tokenizer_name;           // data::Tokenizer::name()
  std::optional<int32_t> end_of_text;   // where `lattice generate` stops
  std::optional<int32_t> declared_eos;  // where transformers stops (hf_declared_eos)
  // config.json's settings read but not applied (a nonzero dropout), one line each.
  std::vector<std::string> ignored;
};

// Reads a Hugging Face model directory (config.json and model.safetensors, or the sharded files
// with their index; F32, BF16 or F16) and writes it as the step-0 checkpoint of `run_dir` (AdamW
// moments zero), with `run_dir`/import.toml holding the settings of a run of that model for
// `lattice train`. When `with_tokenizer` and the directory holds a tokenizer
// (hf_directory_tokenizer_files), its files are copied to `run_dir`/tokenizer and the settings'
// data.tokenizer (the checkpoint's config.toml too) names that copy, so `lattice train` and
// `lattice generate` use it; a tokenizer that does not load, or with more tokens than the model's
// vocab_size, is refused. Missing or extra tensors, wrong shapes and an existing checkpoint in
// `run_dir` are one Error line each; every check runs before anything is written.
HfImportSummary import_hf(const std::string& hf_dir, const std::string& run_dir,
                          bool with_tokenizer = true);

}  // namespace lattice::train
