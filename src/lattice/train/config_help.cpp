// The training config's help as text and as markdown (config_help.hpp), from the key schema.
#include "lattice/train/config_help.hpp"

#include <algorithm>
#include <string>

#include "lattice/train/config_schema.hpp"

namespace lattice::train {

namespace {

std::string padded(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// A table cell: '|' would end the cell, so it is escaped (also inside code spans, as GitHub reads
// tables).
std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string code_span(const std::string& s) {
  std::string out(1, '`');
  out.append(cell(s)).push_back('`');
  return out;
}

// Defaults longer than this are not padded to (their line runs long instead).
constexpr size_t kDefaultColumn = 16;

}  // namespace

std::string config_help_text() {
  std::string out =
      "Config keys of `lattice train`, by [section]: name, type, default, meaning.\n"
      "Set them in the TOML file or override any as --section.key=value.\n";
  for (const ConfigSection& section : config_sections()) {
    size_t name_width = 0, type_width = 0, default_width = 0;
    for (const ConfigKey& key : config_keys()) {
      if (key.section != section.name) continue;
      name_width = std::max(name_width, key.name.size());
      type_width = std::max(type_width, key.type.size());
      const size_t d = config_default_text(key).size();
      if (d <= kDefaultColumn) default_width = std::max(default_width, d);
    }
    out += "\n[" + section.name + "]  " + section.help + "\n";
    for (const ConfigKey& key : config_keys()) {
      if (key.section != section.name) continue;
      out += "  " + padded(key.name, name_width) + "  " + padded(key.type, type_width) + "  " +
             padded(config_default_text(key), default_width) + "  " + key.help + "\n";
    }
  }
  return out;
}

std::string config_help_markdown() {
  std::string out =
      "| section | key | type | default | meaning |\n"
      "|---|---|---|---|---|\n";
  for (const ConfigSection& section : config_sections())
    for (const ConfigKey& key : config_keys())
      if (key.section == section.name) {
        const std::string value = config_default_text(key);
        for (const std::string& part :
             {key.section, key.name, key.type, value == "unset" ? value : code_span(value),
              cell(key.help)})
          out.append("| ").append(part).append(" ");
        out += "|\n";
      }
  return out;
}

std::string config_sections_text() {
  size_t width = 0;
  for (const ConfigSection& section : config_sections())
    width = std::max(width, section.name.size());
  std::string out;
  for (const ConfigSection& section : config_sections())
    out += "  " + padded(section.name, width) + "  " + section.help + "\n";
  return out;
}

}  // namespace lattice::train
