// The config schema's lookups (config_schema.hpp): typed TOML reads with one refusal line, a key's
// value as TOML text, and the unknown-section and unknown-key refusals with the closest known name.
#include "lattice/train/config_schema.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

#include "lattice/train/config_key_builders.hpp"

namespace lattice::train {

namespace config_detail {

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

void wrong_type(const std::string& key, const char* expected, const toml::node& node) {
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

}  // namespace config_detail

namespace {

// A float field's value is written as a double; it is shown as the shortest text (in %g's form)
// that reads back to the same float (3e-4f as 0.0003, not 0.0003000000142492354), a double's as
// the shortest that reads back to the double. Always with a '.' or an exponent, so that TOML reads
// a float.
std::string number_text(double value) {
  constexpr auto kGeneral = std::chars_format::general;
  char buffer[64];
  const float narrowed = static_cast<float>(value);
  const auto end = static_cast<double>(narrowed) == value
                       ? std::to_chars(buffer, buffer + sizeof buffer, narrowed, kGeneral).ptr
                       : std::to_chars(buffer, buffer + sizeof buffer, value, kGeneral).ptr;
  std::string text(buffer, end);
  if (text.find_first_of(".eEin") == std::string::npos) text += ".0";
  return text;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string node_text(const toml::node& node) {
  if (auto v = node.as_integer()) return std::to_string(v->get());
  if (auto v = node.as_floating_point()) return number_text(v->get());
  if (auto v = node.as_boolean()) return v->get() ? "true" : "false";
  if (auto v = node.as_string()) return quoted(v->get());
  if (auto arr = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < arr->size(); ++i) out += (i ? ", " : "") + node_text(*arr->get(i));
    return out + "]";
  }
  return "?";
}

// Levenshtein distance: insertions, deletions and substitutions of one character.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const char* kListKeys = "`lattice train --help-config` lists every key";

}  // namespace

const ConfigKey* find_config_key(const std::string& section, const std::string& name) {
  for (const ConfigKey& key : config_keys())
    if (key.section == section && key.name == name) return &key;
  return nullptr;
}

std::string config_value_text(const ConfigKey& key, const TrainConfig& config) {
  toml::table table;
  key.get(config, table, key.name);
  const toml::node* node = table.get(key.name);
  return node ? node_text(*node) : "unset";
}

std::string config_default_text(const ConfigKey& key) {
  return config_value_text(key, TrainConfig{});
}

std::string unknown_section_message(const std::string& section, const std::string& origin) {
  const ConfigSection* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const ConfigSection& s : config_sections()) {
    const size_t d = edit_distance(section, s.name);
    if (d < best_distance) best = &s, best_distance = d;
  }
  return "unknown config section [" + section + "]" + origin + ": did you mean [" + best->name +
         "]? " + kListKeys;
}

// The closest key: by edit distance of the key's name, a key of another section counting 2 more
// (so that training.lr finds optimizer.lr, and training.stepz training.steps).
std::string unknown_key_message(const std::string& section, const std::string& name,
                                const std::string& origin) {
  const ConfigKey* best = nullptr;
  size_t best_score = std::numeric_limits<size_t>::max();
  for (const ConfigKey& key : config_keys()) {
    const size_t score = edit_distance(name, key.name) + (key.section == section ? 0 : 2);
    if (score < best_score) best = &key, best_score = score;
  }
  return "unknown config key " + section + "." + name + origin + ": did you mean " +
         best->dotted() + "? " + kListKeys;
}

}  // namespace lattice::train
