// Checkpoints: see checkpoint.hpp.
#include "lattice/train/checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"
#include "lattice/train/sharded_checkpoint.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

namespace {

// One store, every element written by this rank (its tensor-parallel group's rank 0 writes the
// tensors the group holds whole).
std::string save_store(const std::string& run_dir, const model::ModelConfig& config,
                       const model::ParameterStore& params, const optim::AdamWOptimizer& optimizer,
                       const TrainerState& state, const std::string& config_toml,
                       int64_t keep_latest, comm::Communicator& group, int tp_rank) {
  CheckpointSource source;
  source.store = &params;
  source.values = params.values();
  source.ranges = {{0, params.size()}};
  source.moments = [&](int64_t begin, int64_t end, float* m, float* v) {
    const auto bytes = static_cast<size_t>(end - begin) * sizeof(float);
    optimizer.memory().copy(m, optimizer.exp_avg() + begin, bytes, CopyKind::device_to_host);
    optimizer.memory().copy(v, optimizer.exp_avg_sq() + begin, bytes, CopyKind::device_to_host);
  };
  source.tp_rank = tp_rank;
  CheckpointContents contents{run_dir,
                              config,
                              state,
                              optimizer.steps_taken(),
                              config_toml,
                              keep_latest,
                              "tp" + std::to_string(group.size())};
  return save_sharded_checkpoint(contents, {&source, 1}, group);
}

// Reads `name`'s logical tensor into `dst`, the store's tensor of `p`: directly when the store
// holds it whole, else this store's slice of it.
void read_parameter(CheckpointReader& reader, const std::string& name,
                    const model::ParameterInfo& p, float* dst, std::vector<float>& scratch) {
  if (p.shard.whole()) {
    reader.read(name, p.global_shape, dst);
    return;
  }
  scratch.resize(static_cast<size_t>(shape_numel(p.global_shape)));
  reader.read(name, p.global_shape, scratch.data());
  parallel::take_slice(p, scratch.data(), dst);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest) {
  check(!parallel::has_tensor_parallel_slices(params),
        "save_checkpoint: this model holds tensor-parallel slices; save it with the form that "
        "takes its tensor-parallel group (internal error)");
  comm::LocalWorld one(1);
  const auto group = one.take(0);
  return save_store(run_dir, config, params, optimizer, state, config_toml, keep_latest, *group, 0);
}

std::string save_checkpoint(const std::string& run_dir, const model::ModelConfig& config,
                            const model::ParameterStore& params,
                            const optim::AdamWOptimizer& optimizer, const TrainerState& state,
                            const std::string& config_toml, int64_t keep_latest,
                            comm::Communicator& tp) {
  return save_store(run_dir, config, params, optimizer, state, config_toml, keep_latest, tp,
                    tp.rank());
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
  return save_checkpoint(run_dir, model.config(), model.parameters(), optimizer, state, config_toml,
                         keep_latest, tp);
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

std::vector<std::string> checkpoint_candidates(const std::string& run_dir) {
  std::vector<std::string> steps = published_checkpoints(run_dir);
  if (steps.empty() && !fs::is_directory(fs::path(run_dir) / "checkpoints")) return steps;
  std::reverse(steps.begin(), steps.end());
  // The pointer's choice first; a pointer to a checkpoint that is gone leaves the others by step
  // (and is the error when there are none).
  std::string latest;
  try {
    latest = latest_checkpoint(run_dir);
  } catch (const Error&) {
    if (steps.empty()) throw;
  }
  auto it = std::find(steps.begin(), steps.end(), latest);
  if (it != steps.end()) std::rotate(steps.begin(), it, it + 1);
  return steps;
}

void remove_unpublished_checkpoints(const std::string& run_dir) {
  const fs::path folder = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(folder)) return;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.is_directory() && entry.path().filename().string().find(".tmp-") != std::string::npos)
      stale.push_back(entry.path());
  for (const fs::path& dir : stale) fs::remove_all(dir);
}

std::string resolve_checkpoint(const std::string& path) {
  check(fs::exists(path), "checkpoint " + path + " does not exist: check the path");
  if (fs::exists(fs::path(path) / "index.json") || fs::exists(fs::path(path) / "model.safetensors"))
    return path;
  std::string latest = latest_checkpoint(path);
  check(!latest.empty(), path +
                             " is neither a checkpoint directory (no index.json or "
                             "model.safetensors) nor a run directory with checkpoints: point at "
                             "one of those");
  return latest;
}

model::ModelConfig read_checkpoint_model_config(const std::string& checkpoint_dir) {
  return CheckpointReader(checkpoint_dir).model_config();
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, model::Transformer& model,
                             optim::AdamWOptimizer* optimizer) {
  return load_checkpoint(checkpoint_dir, model.config(), model.parameters(), optimizer);
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer) {
  CheckpointReader reader(checkpoint_dir);
  return load_checkpoint(reader, config, params, optimizer);
}

bool read_parameter_state(CheckpointReader& reader, const std::string& prefix,
                          const model::ParameterStore& params, float* out) {
  if (params.parameters().empty() ||
      !reader.contains(prefix + params.parameters().front().stored_name()))
    return false;
  std::vector<float> scratch;
  for (const model::ParameterInfo& p : params.parameters())
    read_parameter(reader, prefix + p.stored_name(), p, out + p.offset, scratch);
  return true;
}

TrainerState load_checkpoint(CheckpointReader& reader, const model::ModelConfig& config,
                             model::ParameterStore& params, optim::AdamWOptimizer* optimizer) {
  const std::string& checkpoint_dir = reader.directory();
  const model::ModelConfig& stored = reader.model_config();
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
  float* values = params.mutable_values();
  std::vector<float> scratch;  // one logical tensor, where this store holds a slice of it
  // A copy of another stage's parameter (a tied head) is read as that parameter.
  for (const model::ParameterInfo& p : params.parameters())
    read_parameter(reader, p.stored_name(), p, values + p.offset, scratch);
  if (optimizer) {
    for (const model::ParameterInfo& p : params.parameters()) {
      read_parameter(reader, "exp_avg/" + p.stored_name(), p, optimizer->exp_avg() + p.offset,
                     scratch);
      read_parameter(reader, "exp_avg_sq/" + p.stored_name(), p, optimizer->exp_avg_sq() + p.offset,
                     scratch);
    }
    optimizer->set_steps_taken(reader.optimizer_steps());
  }
  return reader.state();
}

}  // namespace lattice::train
