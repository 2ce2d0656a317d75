// TrainConfig: reading TOML files and overrides through the key schema (config_schema.hpp), the
// resolved TOML, the LR schedule and the parallel layout (see train_config.hpp); the cross-key
// checks of finalize() are in train_config_checks.cpp.
#include "lattice/train/train_config.hpp"

#include <toml++/toml.h>
#include <algorithm>
#include <sstream>

#include "lattice/core/error.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"
#include "lattice/train/config_schema.hpp"

namespace lattice::train {

namespace {

const ConfigKey& find_key(const std::string& section, const std::string& name,
                          const std::string& origin) {
  if (const ConfigKey* key = find_config_key(section, name)) return *key;
  const bool known_section = std::any_of(config_sections().begin(), config_sections().end(),
                                         [&](const ConfigSection& s) { return s.name == section; });
  throw Error(known_section ? unknown_key_message(section, name, origin)
                            : unknown_section_message(section, origin));
}

void apply_table(TrainConfig& config, const toml::table& root, const std::string& origin) {
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    auto section_table = section_node.as_table();
    if (!section_table)
      throw Error("config key '" + section + "'" + origin +
                  " must be a [section] table: put keys under a section such as [training]");
    // The model preset comes first so that explicit dimensions override it whatever the key order.
    if (section == "model") {
      if (auto preset = section_table->get("preset"))
        find_key("model", "preset", origin).set(config, *preset, "model.preset");
    }
    for (const auto& [key, node] : *section_table) {
      const std::string name(key.str());
      if (section == "model" && name == "preset") continue;
      find_key(section, name, origin).set(config, node, section + "." + name);
    }
  }
}

}  // namespace

optim::LrSchedule TrainConfig::lr_schedule() const {
  optim::LrSchedule s;
  s.peak_lr = optimizer.lr;
  s.warmup_steps = lr_scheduler.warmup_steps;
  s.total_steps = training.steps;
  s.decay = lr_scheduler.decay;
  s.min_lr_ratio = lr_scheduler.min_lr_ratio;
  return s;
}

parallel::ParallelLayout TrainConfig::layout() const {
  parallel::ParallelLayout l;
  l.dp = static_cast<int>(parallelism.dp);
  l.tp = static_cast<int>(parallelism.tp);
  l.sequence_parallel = parallelism.sequence_parallel;
  l.pp = static_cast<int>(parallelism.pp);
  if (parallelism.pp > 1) {
    l.schedule = pipeline::parse_schedule_kind(parallelism.pipeline_schedule);
    l.virtual_stages = static_cast<int>(std::max<int64_t>(1, parallelism.virtual_stages));
  }
  l.cp = static_cast<int>(parallelism.cp);
  l.ep = static_cast<int>(parallelism.ep);
  l.zero_stage = static_cast<int>(parallelism.zero);
  l.hsdp_shard_size = static_cast<int>(parallelism.hsdp_shard_size);
  l.recompute = activation_checkpoint.mode;
  l.recompute_interval = static_cast<int>(activation_checkpoint.interval);
  l.micro_batch_size = static_cast<int>(training.micro_batch_size);
  l.global_batch_size = static_cast<int>(training.global_batch_size);
  l.param_bytes =
      training.precision == kernels::Precision::bf16 && parallelism.zero < 3 ? 4 + 2 : 4;
  l.grad_bytes = 4;
  l.optimizer_bytes = 8;
  l.overlap_grad_reduce = true;
  l.flash_attention = true;
  return l;
}

mesh::MeshShape resolve_layout(const TrainConfig& config, int world_size) {
  return mesh::resolve_layout(config.layout().mesh_shape(), world_size);
}

std::string TrainConfig::to_toml() const {
  toml::table root;
  for (const ConfigSection& section : config_sections())
    root.insert_or_assign(section.name, toml::table{});
  for (const ConfigKey& key : config_keys())
    key.get(*this, *root[key.section].as_table(), key.name);
  std::ostringstream out;
  out << "# Resolved Lattice training configuration\n" << root << "\n";
  return out.str();
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig config;
  bool model_in_file = false;  // the file has a [model] table
  if (!path.empty()) {
    toml::table root;
    try {
      root = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      if (e.description().find("File could not be opened") != std::string_view::npos)
        throw Error("cannot read config file " + path + ": check the path");
      throw Error("config file " + path + " is not valid TOML (line " + std::to_string(where.line) +
                  ", column " + std::to_string(where.column) +
                  "): " + std::string(e.description()));
    }
    apply_table(config, root, " in " + path);
    model_in_file = root.contains("model");
  }
  toml::table override_root;
  for (std::string item : overrides) {
    if (item.rfind("--", 0) == 0) item = item.substr(2);
    auto eq = item.find('=');
    auto dot = item.find('.');
    check(eq != std::string::npos && dot != std::string::npos && dot < eq,
          "override '" + item + "' must look like --section.key=value (e.g. --training.steps=100)");
    std::string section = item.substr(0, dot), key = item.substr(dot + 1, eq - dot - 1);
    std::string value = item.substr(eq + 1);
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      parsed.insert_or_assign("v", value);  // a bare word is a string
    }
    if (!override_root.contains(section)) override_root.insert_or_assign(section, toml::table{});
    override_root[section].as_table()->insert_or_assign(key, *parsed.get("v"));
  }
  apply_table(config, override_root, " (command-line override)");
  if (!config.checkpoint.init_from.empty()) {
    // Fine-tuning: the model is the checkpoint's.
    const std::string& from = config.checkpoint.init_from;
    check(config.checkpoint.resume_from.empty(),
          "checkpoint.init_from and checkpoint.resume_from both name a checkpoint: keep "
          "resume_from to continue a run, or init_from to start a new one from weights");
    const CheckpointReader reader(resolve_checkpoint(from));
    check(reader.state().step == 0,
          "checkpoint.init_from = " + from + " is a step-" + std::to_string(reader.state().step) +
              " checkpoint of a run: continue it with checkpoint.resume_from, or start from a "
              "step-0 checkpoint (lattice import's)");
    // [model] keys may only repeat the checkpoint's model (a run's own config.toml does).
    const bool model_given = model_in_file || override_root.contains("model");
    check(!model_given || model::model_config_to_json(config.model) ==
                              model::model_config_to_json(reader.model_config()),
          "checkpoint.init_from = " + from +
              " brings its model settings, and the [model] keys describe another model: remove "
              "them (the model section and model.* overrides)");
    config.model = reader.model_config();
  }
  config.finalize();
  return config;
}

}  // namespace lattice::train
