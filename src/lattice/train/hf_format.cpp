// Hugging Face interop: see hf_format.hpp.
#include "lattice/train/hf_format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/dataset_manifest.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"
#include "lattice/train/hf_config.hpp"
#include "lattice/train/hf_deepseek.hpp"
#include "lattice/train/hf_tokenizer.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// MemAvailable of /proc/meminfo in bytes (0 where it cannot be read: no limit).
int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Transposes a row-major [rows, cols] matrix into [cols, rows].
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// The name transformers gives `dtype` in config.json's torch_dtype (4.x) and dtype (5.x).
const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      return "float32";
  }
}

// An optional token id as JSON: the id, or null.
json id_json(const std::optional<int32_t>& id) {
  return id ? json(*id) : json(nullptr);
}

}  // namespace

bool hf_transposed(const model::ModelConfig& config, const std::string& name) {
  if (config.family != model::Family::gpt2) return false;
  for (const char* suffix :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (ends_with(name, suffix)) return true;
  return false;
}

HfExportSummary export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                          int64_t max_shard_bytes, const std::string& tokenizer_spec,
                          int64_t memory_limit_bytes, DType dtype) {
  check(max_shard_bytes > 0, "--max-shard-mb must be positive");
  check(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
        "Hugging Face export: weights cannot be written as " + std::string(dtype_name(dtype)) +
            ": use --dtype fp32, bf16 or fp16");
  check(!fs::exists(out_dir),
        "Hugging Face export: " + out_dir + " already exists: choose a new --out or remove it");
  CheckpointReader reader(checkpoint_dir);
  const model::ModelConfig& config = reader.model_config();
  // config.json: the mapping's keys, the weights' dtype, and with a tokenizer its special ids.
  json config_json = json::parse(hf_config_json(config));
  config_json["torch_dtype"] = torch_dtype_name(dtype);  // transformers 4.x
  config_json["dtype"] = torch_dtype_name(dtype);        // transformers 5.x
  const std::vector<HfTokenizerFile> tokenizer = hf_export_tokenizer_files(tokenizer_spec);
  std::optional<json> generation_config;
  if (!tokenizer.empty()) {
    const std::unique_ptr<data::Tokenizer> loaded = load_tokenizer_for_model(
        tokenizer_spec, config.vocab_size, "Hugging Face export",
        "pass --tokenizer with the tokenizer the run trained with, or --tokenizer byte to export "
        "without one");
    const HfSpecialTokenIds ids = hf_special_token_ids(*loaded, tokenizer[0].source.parent_path());
    config_json["bos_token_id"] = id_json(ids.bos);
    config_json["eos_token_id"] = id_json(ids.eos);
    config_json["pad_token_id"] = id_json(ids.pad);
    json generation = {{"_from_model_config", true}};
    if (ids.bos) generation["bos_token_id"] = *ids.bos;
    if (ids.eos) generation["eos_token_id"] = *ids.eos;
    if (ids.pad) generation["pad_token_id"] = *ids.pad;
    generation_config = generation;
  }
  // Every weight the model declares must be in the checkpoint, and nothing else: a lost expert or
  // shard is an error here, not a smaller export.
  const auto declared = model::Transformer::declared_only(config);
  std::vector<const model::ParameterInfo*> weights;
  for (const model::ParameterInfo& p : declared->parameters().parameters()) {
    check(reader.contains(p.name), "Hugging Face export: checkpoint " + checkpoint_dir +
                                       " lacks '" + p.name +
                                       "', which the model declares: it is incomplete; export an "
                                       "earlier checkpoint");
    weights.push_back(&p);
  }
  size_t stored = 0;
  for (const std::string& name : reader.names()) stored += name.find('/') == std::string::npos;
  check(stored == weights.size(), "Hugging Face export: checkpoint " + checkpoint_dir + " holds " +
                                      std::to_string(stored) + " weights but the model declares " +
                                      std::to_string(weights.size()) +
                                      ": it does not match its own configuration");
  // The tensors transformers' type has and the model does not (zero: DeepSeek-V3's choice bias
  // of a model without one), after the model's own.
  std::vector<model::ParameterInfo> zero_tensors;
  for (const auto& [name, shape] : hf_zero_tensors(config)) {
    model::ParameterInfo& p = zero_tensors.emplace_back();
    p.name = p.init_stream = name;
    p.shape = p.global_shape = shape;
    p.numel = 1;
    for (int64_t extent : shape) p.numel *= extent;
  }
  std::set<std::string> zero_names;
  for (const model::ParameterInfo& p : zero_tensors) {
    weights.push_back(&p);
    zero_names.insert(p.name);
  }
  // Files of at most max_shard_bytes (of `dtype`), in the model's order.
  const auto element_bytes = static_cast<int64_t>(dtype_size(dtype));
  std::vector<std::vector<const model::ParameterInfo*>> files(1);
  int64_t in_file = 0;
  for (const model::ParameterInfo* p : weights) {
    const int64_t bytes = p->numel * element_bytes;
    if (in_file > 0 && in_file + bytes > max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(p);
    in_file += bytes;
  }
  // What is in memory at once: the largest file's tensors (of `dtype`), and fp32 copies of its
  // largest: a transposed one (fp32), or the read values and their transpose (bf16, f16).
  const int64_t fp32_copies = dtype == DType::f32 ? 1 : 2;
  int64_t peak = 0;
  for (const auto& file : files) {
    int64_t bytes = 0, largest = 0;
    for (const model::ParameterInfo* p : file) {
      bytes += p->numel * element_bytes;
      largest = std::max(largest, p->numel * static_cast<int64_t>(sizeof(float)));
    }
    peak = std::max(peak, bytes + fp32_copies * largest);
  }
  const int64_t limit = memory_limit_bytes > 0 ? memory_limit_bytes : available_memory_bytes();
  check(limit <= 0 || peak <= limit,
        "Hugging Face export: writing " + checkpoint_dir + " needs " + std::to_string(peak >> 20) +
            " MiB in memory at once (its largest file and tensor), " + "more than the " +
            std::to_string(limit >> 20) +
            " MiB available: lower --max-shard-mb (a single tensor larger than memory cannot be "
            "exported on this host)");
  HfExportSummary summary;
  summary.files = static_cast<int>(files.size());
  summary.dtype = dtype;
  StagedDirectory stage(out_dir);
  json weight_map = json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    char name[64];
    if (files.size() == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    std::vector<std::vector<float>> f32_buffers;       // fp32: the values as read
    std::vector<std::vector<uint8_t>> narrow_buffers;  // bf16, f16: their rounded bytes
    std::vector<SafetensorsEntry> entries;
    for (const model::ParameterInfo* p : files[f]) {
      std::vector<float> values(static_cast<size_t>(p->numel));
      if (!zero_names.count(p->name)) reader.read(p->name, p->global_shape, values.data());
      // DeepSeek's rope channels in its interleaved pairs (the config says rope_interleave).
      if (p->global_shape.size() == 2)
        reorder_rope_rows(config, p->name, values.data(), p->global_shape[1], true);
      SafetensorsEntry e;
      e.name = p->name;
      e.dtype = dtype;
      e.shape = p->global_shape;
      if (hf_transposed(config, p->name)) {  // Conv1D: [in, out]
        std::vector<float> out(values.size());
        transpose(values.data(), p->global_shape[0], p->global_shape[1], out.data());
        values.swap(out);
        e.shape = {p->global_shape[1], p->global_shape[0]};
      }
      if (dtype == DType::f32) {
        e.data = f32_buffers.emplace_back(std::move(values)).data();
        e.nbytes = static_cast<size_t>(p->numel) * sizeof(float);
      } else {
        const std::vector<uint8_t>& stored =
            narrow_buffers.emplace_back(f32_as_dtype(values.data(), p->numel, dtype, p->name));
        e.data = stored.data();
        e.nbytes = stored.size();
      }
      summary.bytes += static_cast<int64_t>(e.nbytes);
      ++summary.tensors;
      weight_map[p->name] = name;
      entries.push_back(std::move(e));
    }
    write_safetensors(stage.file_path(name), entries, {{"format", "pt"}});
  }
  if (files.size() > 1) {
    const json index = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    write_text_atomic(stage.file_path("model.safetensors.index.json"), index.dump(2) + "\n");
  }
  write_text_atomic(stage.file_path("config.json"), config_json.dump(2) + "\n");
  if (generation_config)
    write_text_atomic(stage.file_path("generation_config.json"), generation_config->dump(2) + "\n");
  for (const auto& [source, name] : tokenizer) {
    check(fs::exists(source), "Hugging Face export: " + source.string() +
                                  " (the tokenizer's) does not exist: pass --tokenizer with a "
                                  "complete tokenizer");
    write_text_atomic(stage.file_path(name), read_file_text(source.string()));
    summary.tokenizer += (summary.tokenizer.empty() ? "" : ", ") + name;
  }
  stage.commit();
  return summary;
}

HfImportSummary import_hf(const std::string& hf_dir, const std::string& run_dir,
                          bool with_tokenizer) {
  const fs::path dir(hf_dir);
  const fs::path config_path = dir / "config.json";
  check(fs::exists(config_path), hf_dir +
                                     " has no config.json: point at a Hugging Face model "
                                     "directory (what save_pretrained writes)");
  std::vector<std::string> ignored;
  const std::string config_text = read_file_text(config_path.string());
  const model::ModelConfig config =
      model_config_from_hf(config_text, config_path.string(), &ignored);
  const HfWeightLayout layout = hf_weight_layout(json::parse(config_text));
  check(latest_checkpoint(run_dir).empty(),
        run_dir + " already holds checkpoints: import into a new run directory");
  // The tokenizer, loaded (and checked against the model) where it lies, before anything is
  // written; the run gets a copy in run_dir/tokenizer.
  HfImportSummary summary;
  summary.config = config;
  summary.ignored = ignored;
  const std::vector<HfTokenizerFile> tokenizer_files =
      with_tokenizer ? hf_directory_tokenizer_files(dir) : std::vector<HfTokenizerFile>{};
  if (!tokenizer_files.empty()) {
    const std::unique_ptr<data::Tokenizer> tokenizer = load_tokenizer_for_model(
        tokenizer_files[0].source.string(), config.vocab_size, "import of " + hf_dir,
        "repair or remove the tokenizer files, or pass --no-tokenizer to import the weights "
        "alone");
    summary.tokenizer = data::absolute_tokenizer_spec((fs::path(run_dir) / "tokenizer").string());
    for (const HfTokenizerFile& file : tokenizer_files)
      summary.tokenizer_files += (summary.tokenizer_files.empty() ? "" : ", ") + file.name;
    summary.tokenizer_name = tokenizer->name();
    summary.end_of_text = tokenizer->end_of_text();
    summary.declared_eos = hf_declared_eos(dir);
  }
  // Which file holds each tensor.
  std::map<std::string, std::string> file_of;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    try {
      const json index = json::parse(read_file_text(index_path.string()));
      for (const auto& [name, file] : index.at("weight_map").items())
        file_of[name] = file.get<std::string>();
    } catch (const json::exception& e) {
      throw Error(index_path.string() + " is damaged (" + std::string(e.what()) +
                  "): repair it or save the model again");
    }
  } else {
    check(fs::exists(dir / "model.safetensors"),
          hf_dir +
              " has neither model.safetensors nor model.safetensors.index.json: save the "
              "model with safe_serialization (the default of save_pretrained)");
    for (const std::string& name : SafetensorsFile((dir / "model.safetensors").string()).names())
      file_of[name] = "model.safetensors";
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  model::Transformer model(config, nullptr);
  model::ParameterStore& store = model.parameters();
  std::set<std::string> used;
  std::vector<float> scratch;
  for (const model::ParameterInfo& p : store.parameters()) {
    auto it = file_of.find(p.name);
    check(it != file_of.end(), hf_dir + " lacks the weight '" + p.name + "' that a " + config.name +
                                   " model of its config.json has");
    auto& file = files[it->second];
    if (!file) file = std::make_unique<SafetensorsFile>((dir / it->second).string());
    const SafetensorsEntry& entry = file->entry(p.name);
    check(entry.dtype == DType::f32 || entry.dtype == DType::bf16 || entry.dtype == DType::f16,
          hf_dir + ": '" + p.name + "' is " + std::string(dtype_name(entry.dtype)) +
              "; Lattice imports F32, BF16 and F16 weights: save the model in float32, bfloat16 "
              "or float16");
    const bool transposed = hf_transposed(config, p.name);
    const Shape want = transposed ? Shape{p.shape[1], p.shape[0]} : p.shape;
    check(entry.shape == want, hf_dir + ": '" + p.name + "' has another shape than its " +
                                   "config.json implies: the files and the config disagree");
    float* dst = store.mutable_values() + p.offset;
    if (transposed) {
      scratch.resize(static_cast<size_t>(p.numel));
      file->read_f32(p.name, scratch.data(), p.numel);
      transpose(scratch.data(), want[0], want[1], dst);
    } else {
      file->read_f32(p.name, dst, p.numel);
    }
    if (layout.interleaved_rope && p.shape.size() == 2)
      reorder_rope_rows(config, p.name, dst, p.shape[1], false);
    used.insert(p.name);
  }
  // Multi-token-prediction layers (DeepSeek-V3's model.layers.61.*): transformers does not load
  // them either; reported, not imported.
  int64_t prediction_weights = 0;
  for (const auto& [name, file] : file_of)
    if (!used.count(name) && layout.is_prediction_weight(name)) {
      used.insert(name);
      ++prediction_weights;
    }
  if (prediction_weights > 0)
    summary.ignored.push_back(
        std::to_string(prediction_weights) + " weights of the multi-token-prediction layer(s) " +
        "model.layers." + std::to_string(layout.n_layers) +
        ".* are not imported (transformers does not load them either): the run trains the " +
        "next-token model alone");
  for (const auto& [name, file] : file_of) {
    const bool buffer = ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
                        ends_with(name, "rotary_emb.inv_freq");
    const bool tied_head = name == "lm_head.weight" && config.tied_embeddings;
    check(used.count(name) || buffer || tied_head,
          hf_dir + " has the weight '" + name + "', which a " + config.name +
              " model of its config.json does not: the files and the config disagree");
  }
  // The step-0 checkpoint (moments zero), and the settings to train from it.
  TrainConfig settings = load_train_config("", {"job.run_dir=" + run_dir});
  settings.model = config;
  if (!summary.tokenizer.empty()) settings.data.tokenizer = summary.tokenizer;
  // The [model] keys in full; without the default preset's name, which would describe another
  // model.
  std::string toml = settings.to_toml();
  const size_t preset = toml.find("\npreset = ");
  if (preset != std::string::npos) toml.erase(preset + 1, toml.find('\n', preset + 1) - preset);
  const std::unique_ptr<kernels::Ops> ops = kernels::make_ops(Device::cpu);
  optim::AdamWOptimizer adamw(*ops, store, settings.optimizer.adamw, nullptr);
  // The tokenizer's copy is staged first and published after the checkpoint: an error in between
  // leaves no tokenizer folder behind.
  std::optional<StagedDirectory> tokenizer_stage;
  if (!tokenizer_files.empty()) {
    fs::create_directories(run_dir);
    tokenizer_stage.emplace(summary.tokenizer);
    for (const HfTokenizerFile& file : tokenizer_files)
      write_text_atomic(tokenizer_stage->file_path(file.name),
                        read_file_text(file.source.string()));
  }
  save_checkpoint(run_dir, model, adamw, TrainerState{0, 0, settings.training.seed}, toml, 2);
  if (tokenizer_stage) tokenizer_stage->commit();
  write_text_atomic((fs::path(run_dir) / "import.toml").string(), toml);
  return summary;
}

}  // namespace lattice::train
