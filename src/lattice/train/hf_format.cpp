// Hugging Face interop: see hf_format.hpp.
#include "lattice/train/hf_format.hpp"

#include "lattice/train/hf_config.hpp"

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
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"
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

// The tokenizer files a spec names: {source path, name in a Hugging Face directory}.
std::vector<std::pair<fs::path, std::string>> tokenizer_files(const std::string& spec) {
  if (spec.empty() || spec == "byte") return {};
  fs::path path(spec.rfind("tiktoken:", 0) == 0 ? spec.substr(9) : spec);
  check(fs::exists(path), "Hugging Face export: the tokenizer " + spec +
                              " does not exist: pass --tokenizer with its path, or --tokenizer "
                              "byte to export without tokenizer files");
  if (fs::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "encoder.json", "vocab.json"})
      if (fs::exists(path / name)) return tokenizer_files((path / name).string());
    throw Error("Hugging Face export: " + spec +
                " holds no tokenizer.json, encoder.json or vocab.json: pass the tokenizer's path");
  }
  const std::string name = path.filename().string();
  if (name == "encoder.json")
    return {{path, "vocab.json"}, {path.parent_path() / "vocab.bpe", "merges.txt"}};
  if (name == "vocab.json")
    return {{path, "vocab.json"}, {path.parent_path() / "merges.txt", "merges.txt"}};
  if (path.extension() == ".json") return {{path, "tokenizer.json"}};
  throw Error("Hugging Face export: the tokenizer " + spec +
              " has no Hugging Face form (tiktoken ranks): pass --tokenizer byte to export without "
              "tokenizer files");
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
                          int64_t memory_limit_bytes) {
  check(max_shard_bytes > 0, "--max-shard-mb must be positive");
  check(!fs::exists(out_dir),
        "Hugging Face export: " + out_dir + " already exists: choose a new --out or remove it");
  CheckpointReader reader(checkpoint_dir);
  const model::ModelConfig& config = reader.model_config();
  const std::string config_json = hf_config_json(config);
  const auto tokenizer = tokenizer_files(tokenizer_spec);
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
  // Files of at most max_shard_bytes, in the model's order.
  std::vector<std::vector<const model::ParameterInfo*>> files(1);
  int64_t in_file = 0;
  for (const model::ParameterInfo* p : weights) {
    const int64_t bytes = p->numel * static_cast<int64_t>(sizeof(float));
    if (in_file > 0 && in_file + bytes > max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(p);
    in_file += bytes;
  }
  // What is in memory at once: the largest file's tensors, and a transposed copy of its largest.
  int64_t peak = 0;
  for (const auto& file : files) {
    int64_t bytes = 0, largest = 0;
    for (const model::ParameterInfo* p : file) {
      bytes += p->numel * static_cast<int64_t>(sizeof(float));
      largest = std::max(largest, p->numel * static_cast<int64_t>(sizeof(float)));
    }
    peak = std::max(peak, bytes + largest);
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
  StagedDirectory stage(out_dir);
  json weight_map = json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    char name[64];
    if (files.size() == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    std::vector<std::vector<float>> buffers;
    std::vector<SafetensorsEntry> entries;
    for (const model::ParameterInfo* p : files[f]) {
      std::vector<float>& values = buffers.emplace_back(static_cast<size_t>(p->numel));
      reader.read(p->name, p->global_shape, values.data());
      SafetensorsEntry e;
      e.name = p->name;
      e.dtype = DType::f32;
      e.shape = p->global_shape;
      if (hf_transposed(config, p->name)) {  // Conv1D: [in, out]
        std::vector<float> out(values.size());
        transpose(values.data(), p->global_shape[0], p->global_shape[1], out.data());
        values.swap(out);
        e.shape = {p->global_shape[1], p->global_shape[0]};
      }
      e.data = values.data();
      e.nbytes = values.size() * sizeof(float);
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
  write_text_atomic(stage.file_path("config.json"), config_json);
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

model::ModelConfig import_hf(const std::string& hf_dir, const std::string& run_dir) {
  const fs::path dir(hf_dir);
  const fs::path config_path = dir / "config.json";
  check(fs::exists(config_path), hf_dir +
                                     " has no config.json: point at a Hugging Face model "
                                     "directory (what save_pretrained writes)");
  const model::ModelConfig config =
      model_config_from_hf(read_file_text(config_path.string()), config_path.string());
  check(latest_checkpoint(run_dir).empty(),
        run_dir + " already holds checkpoints: import into a new run directory");
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
    used.insert(p.name);
  }
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
  // The [model] keys in full; without the default preset's name, which would describe another
  // model.
  std::string toml = settings.to_toml();
  const size_t preset = toml.find("\npreset = ");
  if (preset != std::string::npos) toml.erase(preset + 1, toml.find('\n', preset + 1) - preset);
  const std::unique_ptr<kernels::Ops> ops = kernels::make_ops(Device::cpu);
  optim::AdamWOptimizer adamw(*ops, store, settings.optimizer.adamw, nullptr);
  save_checkpoint(run_dir, model, adamw, TrainerState{0, 0, settings.training.seed}, toml, 2);
  write_text_atomic((fs::path(run_dir) / "import.toml").string(), toml);
  return config;
}

}  // namespace lattice::train
