// TrainConfig: the TOML schema, overrides and the resolved TOML (see train_config.hpp); the
// cross-key checks of finalize() are in train_config_checks.cpp.
#include "lattice/train/train_config.hpp"

#include <toml++/toml.h>
#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "lattice/core/error.hpp"

namespace lattice::train {

namespace {

using Setter = std::function<void(TrainConfig&, const toml::node&, const std::string& key)>;
using Getter = std::function<void(const TrainConfig&, toml::table&, const std::string& name)>;
struct KeySpec {
  Setter set;
  Getter get;
};
using Schema = std::map<std::string, std::map<std::string, KeySpec>>;

std::string node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

[[noreturn]] void wrong_type(const std::string& key, const char* expected, const toml::node& node) {
  throw Error("config key " + key + " must be " + expected + ", got " + node_type_name(node));
}

int64_t as_int(const toml::node& node, const std::string& key) {
  if (auto v = node.as_integer()) return v->get();
  wrong_type(key, "an integer", node);
}
double as_double(const toml::node& node, const std::string& key) {
  if (auto v = node.as_floating_point()) return v->get();
  if (auto v = node.as_integer()) return static_cast<double>(v->get());
  wrong_type(key, "a number", node);
}
bool as_bool(const toml::node& node, const std::string& key) {
  if (auto v = node.as_boolean()) return v->get();
  wrong_type(key, "a boolean (true or false)", node);
}
std::string as_string(const toml::node& node, const std::string& key) {
  if (auto v = node.as_string()) return v->get();
  wrong_type(key, "a string", node);
}
std::vector<std::string> as_string_list(const toml::node& node, const std::string& key) {
  std::vector<std::string> out;
  if (auto s = node.as_string()) return {s->get()};
  auto arr = node.as_array();
  if (!arr) wrong_type(key, "an array of strings", node);
  for (const auto& item : *arr) {
    auto s = item.as_string();
    if (!s) wrong_type(key, "an array of strings", item);
    out.push_back(s->get());
  }
  return out;
}

std::vector<int64_t> as_int_list(const toml::node& node, const std::string& key) {
  std::vector<int64_t> out;
  auto arr = node.as_array();
  if (!arr) wrong_type(key, "an array of integers", node);
  for (const auto& item : *arr) {
    auto v = item.as_integer();
    if (!v) wrong_type(key, "an array of integers", item);
    out.push_back(v->get());
  }
  return out;
}

template <class T>
KeySpec int_key(T TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = static_cast<T>(as_int(n, k));
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<int64_t>(c.*member));
          }};
}
template <class T>
KeySpec float_key(T TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = static_cast<T>(as_double(n, k));
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<double>(c.*member));
          }};
}
KeySpec bool_key(bool TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = as_bool(n, k);
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.*member);
          }};
}
KeySpec string_key(std::string TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = as_string(n, k);
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.*member);
          }};
}
KeySpec list_key(std::vector<std::string> TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = as_string_list(n, k);
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            toml::array arr;
            for (const auto& s : c.*member) arr.push_back(s);
            t.insert_or_assign(name, arr);
          }};
}
KeySpec int_list_key(std::vector<int64_t> TrainConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.*member = as_int_list(n, k);
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            toml::array arr;
            for (int64_t v : c.*member) arr.push_back(v);
            t.insert_or_assign(name, arr);
          }};
}
// Keys of the model dimensions and the AdamW settings live in nested structs.
template <class T>
KeySpec model_int(T model::ModelConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.*member = static_cast<T>(as_int(n, k));
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<int64_t>(c.model.*member));
          }};
}
template <class T>
KeySpec model_float(T model::ModelConfig::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.*member = static_cast<T>(as_double(n, k));
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<double>(c.model.*member));
          }};
}
// A model key naming an enumerator: read with `parse`, written with `name`.
template <class E>
KeySpec model_enum(E model::ModelConfig::*member, E (*parse)(const std::string&),
                   std::string (*name)(E)) {
  return {[member, parse](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.*member = parse(as_string(n, k));
          },
          [member, name](const TrainConfig& c, toml::table& t, const std::string& key) {
            t.insert_or_assign(key, name(c.model.*member));
          }};
}
KeySpec adamw_float(float optim::AdamWSettings::*member) {
  return {[member](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.adamw.*member = static_cast<float>(as_double(n, k));
          },
          [member](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<double>(c.adamw.*member));
          }};
}

const Schema& schema() {
  static const Schema table = {
      {"job",
       {{"run_dir", string_key(&TrainConfig::run_dir)},
        {"description", string_key(&TrainConfig::description)}}},
      {"model",
       {{"preset",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model_preset = as_string(n, k);
            c.model = model::model_preset(c.model_preset);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.model_preset);
          }}},
        {"family",
         model_enum(&model::ModelConfig::family, model::parse_family, model::family_name)},
        {"vocab_size", model_int(&model::ModelConfig::vocab_size)},
        {"max_seq_len", model_int(&model::ModelConfig::max_seq_len)},
        {"d_model", model_int(&model::ModelConfig::d_model)},
        {"n_layers", model_int(&model::ModelConfig::n_layers)},
        {"n_heads", model_int(&model::ModelConfig::n_heads)},
        {"n_kv_heads", model_int(&model::ModelConfig::n_kv_heads)},
        {"ffn_hidden", model_int(&model::ModelConfig::ffn_hidden)},
        {"norm_eps", model_float(&model::ModelConfig::norm_eps)},
        {"rope_theta", model_float(&model::ModelConfig::rope_theta)},
        {"init_std", model_float(&model::ModelConfig::init_std)},
        {"n_experts", model_int(&model::ModelConfig::n_experts)},
        {"top_k", model_int(&model::ModelConfig::top_k)},
        {"moe_layer_interval", model_int(&model::ModelConfig::moe_layer_interval)},
        {"moe_ffn_hidden", model_int(&model::ModelConfig::moe_ffn_hidden)},
        {"moe_shared_experts", model_int(&model::ModelConfig::moe_shared_experts)},
        {"moe_score", model_enum(&model::ModelConfig::moe_score, model::parse_router_score,
                                 model::router_score_name)},
        {"moe_normalize",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.moe_normalize = as_bool(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.model.moe_normalize);
          }}},
        {"moe_scaling", model_float(&model::ModelConfig::moe_scaling)},
        {"moe_capacity_factor",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.moe_capacity_factor = as_double(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            if (c.model.moe_capacity_factor) t.insert_or_assign(name, *c.model.moe_capacity_factor);
          }}},
        {"moe_aux_loss_coef", model_float(&model::ModelConfig::moe_aux_loss_coef)},
        {"moe_z_loss_coef", model_float(&model::ModelConfig::moe_z_loss_coef)},
        {"moe_bias_update_rate", model_float(&model::ModelConfig::moe_bias_update_rate)},
        {"moe_activation", model_enum(&model::ModelConfig::moe_activation,
                                      model::parse_moe_activation, model::moe_activation_name)},
        {"moe_names",
         model_enum(&model::ModelConfig::moe_names, model::parse_moe_names, model::moe_names_name)},
        {"dropout", model_float(&model::ModelConfig::dropout)},
        {"tied_embeddings",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.model.tied_embeddings = as_bool(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.model.tied_embeddings);
          }}}}},
      {"training",
       {{"seed", int_key(&TrainConfig::seed)},
        {"steps", int_key(&TrainConfig::steps)},
        {"seq_len", int_key(&TrainConfig::seq_len)},
        {"micro_batch_size", int_key(&TrainConfig::micro_batch_size)},
        {"global_batch_size", int_key(&TrainConfig::global_batch_size)},
        {"gradient_accumulation_steps", int_key(&TrainConfig::gradient_accumulation_steps)},
        {"threads", int_key(&TrainConfig::threads)},
        {"activation_memory_limit_mb", float_key(&TrainConfig::activation_memory_limit_mb)},
        {"max_norm", adamw_float(&optim::AdamWSettings::max_grad_norm)},
        {"precision",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.precision = kernels::parse_precision(as_string(n, k));
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, std::string(kernels::precision_name(c.precision)));
          }}}}},
      {"optimizer",
       {{"name",
         {[](TrainConfig&, const toml::node& n, const std::string& k) {
            check(as_string(n, k) == "AdamW",
                  "optimizer.name '" + as_string(n, k) + "' is not available: use \"AdamW\"");
          },
          [](const TrainConfig&, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, "AdamW");
          }}},
        {"lr", float_key(&TrainConfig::lr)},
        {"beta1", adamw_float(&optim::AdamWSettings::beta1)},
        {"beta2", adamw_float(&optim::AdamWSettings::beta2)},
        {"eps", adamw_float(&optim::AdamWSettings::eps)},
        {"weight_decay", adamw_float(&optim::AdamWSettings::weight_decay)}}},
      {"lr_scheduler",
       {{"warmup_steps", int_key(&TrainConfig::warmup_steps)},
        {"min_lr_ratio", float_key(&TrainConfig::min_lr_ratio)},
        {"decay",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.decay = optim::parse_decay(as_string(n, k));
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, optim::decay_name(c.decay));
          }}}}},
      {"parallelism",
       {{"dp", int_key(&TrainConfig::dp)},
        {"tp", int_key(&TrainConfig::tp)},
        {"sequence_parallel", bool_key(&TrainConfig::sequence_parallel)},
        {"pp", int_key(&TrainConfig::pp)},
        {"pipeline_schedule", string_key(&TrainConfig::pipeline_schedule)},
        {"virtual_stages", int_key(&TrainConfig::virtual_stages)},
        {"pipeline_layers", int_list_key(&TrainConfig::pipeline_layers)},
        {"pipeline_partition", string_key(&TrainConfig::pipeline_partition)},
        {"pipeline_schedule_file", string_key(&TrainConfig::pipeline_schedule_file)},
        {"cp", int_key(&TrainConfig::cp)},
        {"ep", int_key(&TrainConfig::ep)},
        {"zero", int_key(&TrainConfig::zero)},
        {"bucket_mb", float_key(&TrainConfig::bucket_mb)},
        {"check_replicas", bool_key(&TrainConfig::check_replicas)},
        {"backend", string_key(&TrainConfig::backend)},
        {"baseline_tokens_per_second", float_key(&TrainConfig::baseline_tokens_per_second)},
        {"hsdp_shard_size", int_key(&TrainConfig::hsdp_shard_size)},
        {"offload_dir", string_key(&TrainConfig::offload_dir)}}},
      {"context_parallel",
       {{"mode",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.cp_mode = parallel::parse_context_parallel_mode(as_string(n, k));
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, std::string(parallel::context_parallel_mode_name(c.cp_mode)));
          }}}}},
      {"activation_checkpoint",
       {{"mode",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.activation_checkpoint.mode = model::parse_recompute(as_string(n, k));
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, model::recompute_name(c.activation_checkpoint.mode));
          }}},
        {"interval",
         {[](TrainConfig& c, const toml::node& n, const std::string& k) {
            c.activation_checkpoint.interval = as_int(n, k);
          },
          [](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, c.activation_checkpoint.interval);
          }}}}},
      {"checkpoint",
       {{"enable", bool_key(&TrainConfig::checkpoint_enable)},
        {"interval", int_key(&TrainConfig::checkpoint_interval)},
        {"keep_latest", int_key(&TrainConfig::keep_latest)},
        {"async", bool_key(&TrainConfig::checkpoint_async)},
        {"resume", bool_key(&TrainConfig::resume)},
        {"resume_from", string_key(&TrainConfig::resume_from)}}},
      {"metrics",
       {{"log_freq", int_key(&TrainConfig::log_freq)},
        {"jsonl", bool_key(&TrainConfig::jsonl)},
        {"tensorboard", bool_key(&TrainConfig::tensorboard)},
        {"peak_tflops", float_key(&TrainConfig::peak_tflops)},
        {"trace", string_key(&TrainConfig::trace)},
        {"trace_steps", string_key(&TrainConfig::trace_steps)}}},
      {"data",
       {{"train_files", list_key(&TrainConfig::train_files)},
        {"exclude", list_key(&TrainConfig::exclude)},
        {"val_fraction", float_key(&TrainConfig::val_fraction)},
        {"tokenizer", string_key(&TrainConfig::tokenizer)},
        {"dataset", string_key(&TrainConfig::dataset)},
        {"format", string_key(&TrainConfig::data_format)},
        {"val_dataset", string_key(&TrainConfig::val_dataset)}}},
      {"validation",
       {{"freq", int_key(&TrainConfig::val_freq)},
        {"batches", int_key(&TrainConfig::val_batches)}}},
  };
  return table;
}

std::string key_list(const std::map<std::string, KeySpec>& keys) {
  std::string s;
  for (const auto& [name, _] : keys) s += (s.empty() ? "" : ", ") + name;
  return s;
}

const KeySpec& find_key(const std::string& section, const std::string& name,
                        const std::string& origin) {
  auto sec = schema().find(section);
  if (sec == schema().end()) {
    std::string sections;
    for (const auto& [n, _] : schema()) sections += (sections.empty() ? "" : ", ") + n;
    throw Error("unknown config section [" + section + "]" + origin + ": valid sections are " +
                sections);
  }
  auto key = sec->second.find(name);
  if (key == sec->second.end())
    throw Error("unknown config key " + section + "." + name + origin + ": valid keys in [" +
                section + "] are " + key_list(sec->second));
  return key->second;
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
  s.peak_lr = lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = steps;
  s.decay = decay;
  s.min_lr_ratio = min_lr_ratio;
  return s;
}

parallel::ParallelLayout TrainConfig::layout() const {
  parallel::ParallelLayout l;
  l.dp = static_cast<int>(dp);
  l.tp = static_cast<int>(tp);
  l.sequence_parallel = sequence_parallel;
  l.pp = static_cast<int>(pp);
  if (pp > 1) {
    l.schedule = pipeline::parse_schedule_kind(pipeline_schedule);
    l.virtual_stages = static_cast<int>(std::max<int64_t>(1, virtual_stages));
  }
  l.cp = static_cast<int>(cp);
  l.ep = static_cast<int>(ep);
  l.zero_stage = static_cast<int>(zero);
  l.hsdp_shard_size = static_cast<int>(hsdp_shard_size);
  l.recompute = activation_checkpoint.mode;
  l.recompute_interval = static_cast<int>(activation_checkpoint.interval);
  l.micro_batch_size = static_cast<int>(micro_batch_size);
  l.global_batch_size = static_cast<int>(global_batch_size);
  l.param_bytes = precision == kernels::Precision::bf16 && zero < 3 ? 4 + 2 : 4;
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
  for (const auto& [section, keys] : schema()) {
    toml::table t;
    for (const auto& [name, spec] : keys) spec.get(*this, t, name);
    root.insert_or_assign(section, t);
  }
  std::ostringstream out;
  out << "# Resolved Lattice training configuration\n" << root << "\n";
  return out.str();
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig config;
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
  config.finalize();
  return config;
}

}  // namespace lattice::train
