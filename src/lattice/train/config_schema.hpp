// The training config's schema: every key of every [section] once, with its type, its one-line help
// and how it is read from TOML and written back. The parser (train_config.cpp), the resolved TOML,
// `lattice train --help-config` and docs/training.md's key table all come from this one table; a
// key's default is rendered from a default-constructed TrainConfig, never typed twice.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <string>
#include <vector>

#include "lattice/train/train_config.hpp"

namespace lattice::train {

struct ConfigKey {
  std::string section, name;
  std::string type;  // "integer", "number", "boolean", "string", "list of strings", ...
  std::string help;  // one line
  // Reads `node` into the config; `key` ("section.name") names it in a refusal.
  std::function<void(TrainConfig&, const toml::node& node, const std::string& key)> set;
  // Writes the config's value into `table` under `name` (nothing when the value is unset).
  std::function<void(const TrainConfig&, toml::table& table, const std::string& name)> get;

  std::string dotted() const { return section + "." + name; }
};

struct ConfigSection {
  std::string name;
  std::string help;  // one line: what the section's keys are about
};

// The sections in the order help and docs list them.
const std::vector<ConfigSection>& config_sections();
// Every key, grouped by section in config_sections()'s order.
const std::vector<ConfigKey>& config_keys();
// The key `section.name`, or nullptr.
const ConfigKey* find_config_key(const std::string& section, const std::string& name);
// The key's value in `config` as TOML text (`"runs/default"`, `0.0003`, `["*.dat", "*.u8"]`), or
// "unset" when it has none.
std::string config_value_text(const ConfigKey& key, const TrainConfig& config);
// The key's default: config_value_text of a default-constructed TrainConfig.
std::string config_default_text(const ConfigKey& key);

// The one-line refusals of an unknown section or key (`origin`: " in file.toml" or " (command-line
// override)"): the name, the closest known one by edit distance, and how to list them all.
std::string unknown_section_message(const std::string& section, const std::string& origin);
std::string unknown_key_message(const std::string& section, const std::string& name,
                                const std::string& origin);

}  // namespace lattice::train
