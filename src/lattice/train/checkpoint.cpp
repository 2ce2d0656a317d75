// Checkpoints: see checkpoint.hpp.
#include "lattice/train/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"

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

// The placement of every parameter (model::ParameterInfo), for the metadata: name ->
// {"global_shape", "shard": {"dim", "index", "count"}, "replicated": [axis names]}. A later reshard
// reads it to know which slice of which logical tensor each stored tensor is.
std::string placements_json(const model::ParameterStore& params) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& p : params.parameters()) {
    nlohmann::json replicated = nlohmann::json::array();
    for (mesh::Axis axis : mesh::kAllAxes)
      if (p.replicated.contains(axis)) replicated.push_back(std::string(mesh::axis_name(axis)));
    nlohmann::json shard = {
        {"dim", p.shard.dim}, {"index", p.shard.index}, {"count", p.shard.count}};
    if (p.shard.blocks > 1) shard["blocks"] = p.shard.blocks;
    if (p.shard.padded > 0) shard["padded"] = p.shard.padded;
    j[p.name] = {{"global_shape", p.global_shape}, {"shard", shard}, {"replicated", replicated}};
  }
  return j.dump();
}

// How each parameter of this store is read from a checkpoint: true where the store holds a slice
// of a tensor the checkpoint holds whole (a logical checkpoint: read it and take the slice), false
// where the stored tensor is the store's own (read it as is). Refuses a checkpoint whose recorded
// placements are neither (a checkpoint written before placements were recorded has none and is
// taken as whole).
std::vector<bool> check_placements(const SafetensorsFile& file, const std::string& path,
                                   const model::ParameterStore& params) {
  std::vector<bool> take_slice;
  for (const auto& p : params.parameters()) take_slice.push_back(!p.shard.whole());
  auto it = file.metadata().find("lattice.placements");
  if (it == file.metadata().end()) return take_slice;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint " + path + " has damaged placement metadata (" + e.what() +
                "): resume from an earlier checkpoint");
  }
  auto shape_text = [](const Shape& shape) {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
  };
  for (size_t i = 0; i < params.parameters().size(); ++i) {
    const model::ParameterInfo& p = params.parameters()[i];
    Shape global;
    model::TensorShard shard;
    try {
      const nlohmann::json& entry = j.at(p.stored_name());
      global = entry.at("global_shape").get<Shape>();
      shard.dim = entry.at("shard").at("dim").get<int>();
      shard.index = entry.at("shard").at("index").get<int>();
      shard.count = entry.at("shard").at("count").get<int>();
      shard.blocks = entry.at("shard").value("blocks", 1);
      shard.padded = entry.at("shard").value("padded", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
      throw Error("checkpoint " + path + ": the placement of '" + p.name +
                  "' is missing or damaged (" + e.what() + "): resume from an earlier checkpoint");
    }
    check(global == p.global_shape, "checkpoint " + path + " holds '" + p.name +
                                        "' with logical shape " + shape_text(global) +
                                        ", this model's is " + shape_text(p.global_shape) +
                                        ": use the same [model] settings or a new job.run_dir");
    take_slice[i] = shard.whole() && !p.shard.whole();
    if (take_slice[i]) continue;
    check(
        shard == p.shard,
        "checkpoint " + path + " holds shard " + std::to_string(shard.index) + " of " +
            std::to_string(shard.count) + " (dimension " + std::to_string(shard.dim) + ") of '" +
            p.name + "', this rank needs shard " + std::to_string(p.shard.index) + " of " +
            std::to_string(p.shard.count) +
            ": resharding a checkpoint is not supported yet; resume with the layout that wrote it");
  }
  return take_slice;
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

// Reads the stored tensor of `p` (named prefix + p.stored_name()) into `dst`, the store's tensor:
// as is, or, with `slice`, this store's slice of the stored logical tensor.
void read_parameter(const SafetensorsFile& file, const std::string& prefix,
                    const model::ParameterInfo& p, bool slice, float* dst,
                    std::vector<float>& scratch) {
  // A copy of another stage's parameter (a tied head) is stored as that parameter.
  if (!slice) {
    file.read_f32(prefix + p.stored_name(), dst, p.numel);
    return;
  }
  scratch.resize(static_cast<size_t>(shape_numel(p.global_shape)));
  file.read_f32(prefix + p.stored_name(), scratch.data(), shape_numel(p.global_shape));
  parallel::take_slice(p, scratch.data(), dst);
}

// Writes the checkpoint directory of `state.step`: the tensors of `params`' layout in `values`,
// `exp_avg` and `exp_avg_sq`, with `params`' placements.
std::string write_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                             const model::ParameterStore& params, const float* values,
                             const float* exp_avg, const float* exp_avg_sq, int64_t optimizer_steps,
                             const TrainerState& state, const std::string& config_toml,
                             int64_t keep_latest) {
  const fs::path folder = fs::path(run_dir) / "checkpoints";
  fs::create_directories(folder);
  const std::string name = step_name(state.step);
  {
    StagedDirectory stage((folder / name).string());
    write_safetensors(stage.file_path("model.safetensors"), parameter_entries(params, values, ""),
                      {{"format", "lattice"},
                       {"lattice.model", model::model_config_to_json(config)},
                       {"lattice.placements", placements_json(params)},
                       {"lattice.weight_layout", "[out, in] for every Linear weight"}});
    write_safetensors(stage.file_path("optimizer.safetensors"),
                      [&] {
                        auto entries = parameter_entries(params, exp_avg, "exp_avg/");
                        auto sq = parameter_entries(params, exp_avg_sq, "exp_avg_sq/");
                        entries.insert(entries.end(), sq.begin(), sq.end());
                        return entries;
                      }(),
                      {{"optimizer", "AdamW"},
                       {"steps_taken", std::to_string(optimizer_steps)},
                       {"lattice.placements", placements_json(params)}});
    nlohmann::json j = {{"step", state.step},
                        {"samples_consumed", state.samples_consumed},
                        {"seed", state.seed},
                        {"optimizer_steps", optimizer_steps}};
    write_text_atomic(stage.file_path("state.json"), j.dump(2) + "\n");
    write_text_atomic(stage.file_path("config.toml"), config_toml);
    stage.commit();
  }
  write_text_atomic((folder / "latest").string(), name + "\n");
  prune_checkpoints(folder, keep_latest);
  return (folder / name).string();
}

// Runs `write` on `group`'s rank 0 and tells every rank whether it could: each returns the
// directory (`dir` where rank 0 did not say), or throws rank 0's error there and a line naming
// rank 0 elsewhere. Collective over `group`.
std::string written_by_rank0(comm::Communicator& group, std::string dir,
                             const std::function<std::string()>& write) {
  int32_t written = 1;
  std::exception_ptr failure;
  if (group.rank() == 0) {
    try {
      dir = write();
    } catch (...) {
      failure = std::current_exception();
      written = 0;
    }
  }
  group.broadcast(&written, 1, DType::i32, 0);
  if (failure) std::rethrow_exception(failure);
  check(written == 1, "rank 0 of the checkpoint's group could not write " + dir +
                          " (its error names the problem)");
  return dir;
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest) {
  check(!parallel::has_tensor_parallel_slices(params),
        "save_checkpoint: this model holds tensor-parallel slices; save it with the form that "
        "takes its tensor-parallel group, which writes the logical tensors (internal error)");
  return write_checkpoint(run_dir, config, params, params.values(), optimizer.exp_avg(),
                          optimizer.exp_avg_sq(), optimizer.steps_taken(), state, config_toml,
                          keep_latest);
}

std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            const model::ParameterStore& logical, comm::Communicator& tp) {
  if (tp.size() == 1 && !parallel::has_tensor_parallel_slices(params))
    return save_checkpoint(run_dir, config, params, optimizer, state, config_toml, keep_latest);
  // Gather the logical weights and moments on rank 0 (all three first: the collective part is
  // over before rank 0 writes), then rank 0 writes and tells the others whether it could.
  const bool writer = tp.rank() == 0;
  std::vector<float> values, exp_avg, exp_avg_sq;
  if (writer)
    for (std::vector<float>* buffer : {&values, &exp_avg, &exp_avg_sq})
      buffer->assign(static_cast<size_t>(logical.size()), 0.0f);
  parallel::gather_logical(params, params.values(), logical, writer ? values.data() : nullptr, tp);
  parallel::gather_logical(params, optimizer.exp_avg(), logical, writer ? exp_avg.data() : nullptr,
                           tp);
  parallel::gather_logical(params, optimizer.exp_avg_sq(), logical,
                           writer ? exp_avg_sq.data() : nullptr, tp);
  return written_by_rank0(
      tp, (fs::path(run_dir) / "checkpoints" / step_name(state.step)).string(), [&] {
        return write_checkpoint(run_dir, config, logical, values.data(), exp_avg.data(),
                                exp_avg_sq.data(), optimizer.steps_taken(), state, config_toml,
                                keep_latest);
      });
}

std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest) {
  return save_checkpoint(run_dir, model.config(), model.parameters(), optimizer, state, config_toml,
                         keep_latest);
}

std::string save_checkpoint(const std::string& run_dir, const model::Transformer& model,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            comm::Communicator& tp) {
  if (tp.size() == 1 && !parallel::has_tensor_parallel_slices(model.parameters()))
    return save_checkpoint(run_dir, model, optimizer, state, config_toml, keep_latest);
  const auto logical = model::Transformer::declared_only(model.config(), model.stage_range());
  return save_checkpoint(run_dir, model.config(), model.parameters(), optimizer, state, config_toml,
                         keep_latest, logical->parameters(), tp);
}

std::string save_whole_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                                  const model::ParameterStore& whole, const float* values,
                                  const float* exp_avg, const float* exp_avg_sq,
                                  int64_t optimizer_steps, const TrainerState& state,
                                  const std::string& config_toml, int64_t keep_latest,
                                  comm::Communicator& group) {
  check(!parallel::has_tensor_parallel_slices(whole),
        "save_whole_checkpoint: the store holds tensor-parallel slices (internal error)");
  return written_by_rank0(
      group, (fs::path(run_dir) / "checkpoints" / step_name(state.step)).string(), [&] {
        return write_checkpoint(run_dir, config, whole, values, exp_avg, exp_avg_sq,
                                optimizer_steps, state, config_toml, keep_latest);
      });
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
  return load_checkpoint(checkpoint_dir, model.config(), model.parameters(), optimizer);
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer) {
  const fs::path dir(checkpoint_dir);
  const auto stored = read_checkpoint_model_config(checkpoint_dir);
  const auto& mine = config;
  const bool same_shape =
      stored.family == mine.family && stored.d_model == mine.d_model &&
      stored.n_layers == mine.n_layers && stored.vocab_size == mine.vocab_size &&
      stored.n_heads == mine.n_heads && stored.n_kv_heads == mine.n_kv_heads &&
      stored.ffn_hidden == mine.ffn_hidden && stored.max_seq_len == mine.max_seq_len &&
      stored.tied_embeddings == mine.tied_embeddings;
  check(same_shape, "checkpoint " + checkpoint_dir + " holds a different model (" +
                        model::model_config_to_json(stored) +
                        "): use the same [model] settings or a new job.run_dir");
  SafetensorsFile weights((dir / "model.safetensors").string());
  const std::vector<bool> weight_slices =
      check_placements(weights, (dir / "model.safetensors").string(), params);
  float* values = params.mutable_values();
  std::vector<float> scratch;  // one logical tensor, where this store holds a slice of it
  for (size_t i = 0; i < params.parameters().size(); ++i) {
    const model::ParameterInfo& p = params.parameters()[i];
    read_parameter(weights, "", p, weight_slices[i], values + p.offset, scratch);
  }
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
    const std::vector<bool> moment_slices =
        check_placements(moments, (dir / "optimizer.safetensors").string(), params);
    for (size_t i = 0; i < params.parameters().size(); ++i) {
      const model::ParameterInfo& p = params.parameters()[i];
      read_parameter(moments, "exp_avg/", p, moment_slices[i], optimizer->exp_avg() + p.offset,
                     scratch);
      read_parameter(moments, "exp_avg_sq/", p, moment_slices[i],
                     optimizer->exp_avg_sq() + p.offset, scratch);
    }
    optimizer->set_steps_taken(j.at("optimizer_steps").get<int64_t>());
  }
  return state;
}

}  // namespace lattice::train
