// The training config's help, rendered from the key schema (config_schema.hpp): every key by
// section with its type, default and meaning, as text (`lattice train --help-config`) or as the
// markdown table docs/training.md carries (`--help-config=markdown`,
// scripts/update_config_docs.sh).
#pragma once

#include <string>

namespace lattice::train {

// Every section and its keys: one line per key (name, type, default, help), aligned per section.
std::string config_help_text();
// One markdown table of every key: | section | key | type | default | meaning |.
std::string config_help_markdown();
// The sections, one "  name  help" line each (for `lattice train --help`).
std::string config_sections_text();

}  // namespace lattice::train
