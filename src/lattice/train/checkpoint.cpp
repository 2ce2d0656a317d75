// Single-rank checkpoints: see checkpoint.hpp.
#include "lattice/train/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/model/model_config_json.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "step_%08lld", static_cast<long long>(step));
  return buffer;
}

std::vector<SafetensorsEntry> parameter_entries(const model::ParameterStore& params,
                                                const float* base, const std::string& prefix) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& p : params.parameters()) {
    SafetensorsEntry e;
    e.name = prefix + p.name;
    e.dtype = DType::f32;
    e.shape = p.shape;
    e.data = base + p.offset;
    e.nbytes = static_cast<size_t>(p.numel) * sizeof(float);
    entries.push_back(std::move(e));
  }
  return entries;
}

void prune_checkpoints(const fs::path& folder, int64_t keep_latest) {
  std::vector<fs::path> steps;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos)
      steps.push_back(entry.path());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_latest) < steps.size(); ++i)
    fs::remove_all(steps[i]);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest) {
  const fs::path folder = fs::path(run_dir) / "checkpoints";
  fs::create_directories(folder);
  const std::string name = step_name(state.step);
  const auto& params = model.parameters();
  {
    StagedDirectory stage((folder / name).string());
    write_safetensors(stage.file_path("model.safetensors"),
                      parameter_entries(params, params.values(), ""),
                      {{"format", "lattice"},
                       {"lattice.model", model::model_config_to_json(model.config())},
                       {"lattice.weight_layout", "[out, in] for every Linear weight"}});
    write_safetensors(
        stage.file_path("optimizer.safetensors"),
        [&] {
          auto entries = parameter_entries(params, optimizer.exp_avg(), "exp_avg/");
          auto sq = parameter_entries(params, optimizer.exp_avg_sq(), "exp_avg_sq/");
          entries.insert(entries.end(), sq.begin(), sq.end());
          return entries;
        }(),
        {{"optimizer", "AdamW"}, {"steps_taken", std::to_string(optimizer.steps_taken())}});
    nlohmann::json j = {{"step", state.step},
                        {"samples_consumed", state.samples_consumed},
                        {"seed", state.seed},
                        {"optimizer_steps", optimizer.steps_taken()}};
    write_text_atomic(stage.file_path("state.json"), j.dump(2) + "\n");
    write_text_atomic(stage.file_path("config.toml"), config_toml);
    stage.commit();
  }
  write_text_atomic((folder / "latest").string(), name + "\n");
  prune_checkpoints(folder, keep_latest);
  return (folder / name).string();
}

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "checkpoints" / "latest";
  if (!fs::exists(pointer)) return "";
  std::string name = read_file_text(pointer.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path dir = pointer.parent_path() / name;
  check(!name.empty() && fs::is_directory(dir),
        "checkpoint pointer " + pointer.string() + " names '" + name +
            "', which does not exist: remove the pointer or restore the checkpoint");
  return dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  check(fs::exists(path), "checkpoint " + path + " does not exist: check the path");
  if (fs::exists(fs::path(path) / "model.safetensors")) return path;
  std::string latest = latest_checkpoint(path);
  check(!latest.empty(), path +
                             " is neither a checkpoint directory (no model.safetensors) nor a "
                             "run directory with checkpoints: point at one of those");
  return latest;
}

model::ModelConfig read_checkpoint_model_config(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "model.safetensors").string();
  SafetensorsFile file(path);
  auto it = file.metadata().find("lattice.model");
  check(it != file.metadata().end(),
        "checkpoint " + path +
            " has no model configuration in its metadata: it was not written by "
            "lattice, so give the model configuration explicitly");
  try {
    return model::model_config_from_json(it->second);
  } catch (const Error& e) {
    throw Error("checkpoint " + path + ": " + e.what() + "; resume from an earlier checkpoint");
  }
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, model::Transformer& model,
                             optim::AdamWOptimizer* optimizer) {
  const fs::path dir(checkpoint_dir);
  const auto stored = read_checkpoint_model_config(checkpoint_dir);
  const auto& mine = model.config();
  const bool same_shape =
      stored.family == mine.family && stored.d_model == mine.d_model &&
      stored.n_layers == mine.n_layers && stored.vocab_size == mine.vocab_size &&
      stored.n_heads == mine.n_heads && stored.n_kv_heads == mine.n_kv_heads &&
      stored.ffn_hidden == mine.ffn_hidden && stored.max_seq_len == mine.max_seq_len &&
      stored.tied_embeddings == mine.tied_embeddings;
  check(same_shape, "checkpoint " + checkpoint_dir + " holds a different model (" +
                        model::model_config_to_json(stored) +
                        "): use the same [model] settings or a new job.run_dir");
  auto& params = model.parameters();
  SafetensorsFile weights((dir / "model.safetensors").string());
  float* values = params.mutable_values();
  for (const auto& p : params.parameters()) weights.read_f32(p.name, values + p.offset, p.numel);
  TrainerState state;
  nlohmann::json j;
  const std::string state_path = (dir / "state.json").string();
  try {
    j = nlohmann::json::parse(read_file_text(state_path));
    state.step = j.at("step").get<int64_t>();
    state.samples_consumed = j.at("samples_consumed").get<int64_t>();
    state.seed = j.at("seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint state " + state_path + " is damaged (" + e.what() +
                "): resume from an earlier checkpoint");
  }
  if (optimizer) {
    SafetensorsFile moments((dir / "optimizer.safetensors").string());
    for (const auto& p : params.parameters()) {
      moments.read_f32("exp_avg/" + p.name, optimizer->exp_avg() + p.offset, p.numel);
      moments.read_f32("exp_avg_sq/" + p.name, optimizer->exp_avg_sq() + p.offset, p.numel);
    }
    optimizer->set_steps_taken(j.at("optimizer_steps").get<int64_t>());
  }
  return state;
}

}  // namespace lattice::train
