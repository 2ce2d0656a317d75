// Hugging Face interop: a checkpoint of any layout exported as a `transformers` model directory
// (config.json, model.safetensors or model-0000k-of-0000n.safetensors with
// model.safetensors.index.json above a size limit, and the tokenizer's files), and such a directory
// imported as a Lattice checkpoint to start a run from. The parameter names are the Hugging Face
// ones already (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM); what
// differs is the layout of GPT-2's Conv1D weights (c_attn, c_proj, c_fc: [in, out] there, [out, in]
// here), which is transposed both ways, and GPT-2's tied head, which Hugging Face stores only as
// the embedding. The config.json mapping is hf_config.hpp's.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/model_config.hpp"
#include "lattice/train/hf_config.hpp"

namespace lattice::train {

// True for the GPT-2 weights that Hugging Face stores transposed (Conv1D).
bool hf_transposed(const model::ModelConfig& config, const std::string& name);

struct HfExportSummary {
  int64_t tensors = 0;    // weights written (every logical weight of the checkpoint)
  int64_t bytes = 0;      // their data bytes
  int files = 0;          // safetensors files
  std::string tokenizer;  // the tokenizer files copied ("" when the run had none to copy)
};

// Writes the weights of the checkpoint `checkpoint_dir` (any layout) as a Hugging Face model
// directory `out_dir`, fp32, in files of at most `max_shard_bytes` (one tensor larger than that
// gets a file of its own), with the tokenizer named by `tokenizer_spec` (a path to tokenizer.json,
// encoder.json / vocab.json, or a directory holding them; "byte" or "": none). The directory is
// staged and renamed into place: an error leaves nothing at `out_dir`, and an existing `out_dir` is
// refused. Each tensor is read (and its pieces' checksums checked) one at a time.
// The export holds one file's tensors (and one tensor's copy) in memory at once: more than
// `memory_limit_bytes` (0: the host's available memory) is refused before anything is written.
HfExportSummary export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                          int64_t max_shard_bytes, const std::string& tokenizer_spec,
                          int64_t memory_limit_bytes = 0);

// Reads a Hugging Face model directory (config.json and model.safetensors, or the sharded files
// with their index; F32, BF16 or F16) and writes it as the step-0 checkpoint of `run_dir` (AdamW
// moments zero), with `run_dir`/config.toml holding the model's [model] settings for `lattice
// train`. Returns the model configuration. Missing or extra tensors, wrong shapes and an existing
// checkpoint in `run_dir` are one Error line each.
model::ModelConfig import_hf(const std::string& hf_dir, const std::string& run_dir);

}  // namespace lattice::train
