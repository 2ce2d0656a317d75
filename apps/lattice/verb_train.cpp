// The `lattice train` verb: `lattice train [config.toml] [--section.key=value ...] [--dp N ...]`,
// and `lattice train --help-config[=markdown]`: every config key with its type, default and help.
#include <cstdio>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/config_help.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_train_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "train",
      "Train a model from a TOML config; any key can be overridden as --section.key=value");
  auto config_path = std::make_shared<std::string>();
  verb->add_option("config", *config_path, "TOML configuration file");
  verb->allow_extras();
  auto help_config = std::make_shared<std::string>();
  verb->add_flag("--help-config{text}", *help_config,
                 "print every config key by section with its type, default and meaning, and exit "
                 "(--help-config=markdown: as the markdown table of docs/training.md)");
  verb->footer(
      "Config sections (TOML [section]s; `lattice train --help-config` lists their keys):\n" +
      train::config_sections_text());
  // Short flags for the layout: --dp N means --parallelism.dp=N (and likewise tp, pp, cp, ep,
  // zero).
  auto layout = std::make_shared<std::vector<std::pair<std::string, int64_t>>>();
  for (const char* axis : {"dp", "tp", "pp", "cp", "ep", "zero"}) {
    verb->add_option_function<int64_t>(
        std::string("--") + axis,
        [layout, axis](const int64_t& value) { layout->emplace_back(axis, value); },
        std::string("shorthand for --parallelism.") + axis + "=N");
  }
  auto replica_group = std::make_shared<int64_t>(-1);
  verb->add_option("--replica-group", *replica_group,
                   "shorthand for --replica.group=G (this process's replica group)");
  verb->callback([verb, config_path, layout, help_config, replica_group] {
    if (!help_config->empty()) {
      check(*help_config == "text" || *help_config == "markdown",
            "--help-config=" + *help_config +
                " is not a format: use --help-config (text) or "
                "--help-config=markdown");
      std::fputs(*help_config == "markdown" ? train::config_help_markdown().c_str()
                                            : train::config_help_text().c_str(),
                 stdout);
      return;
    }
    std::vector<std::string> overrides;
    for (const std::string& arg : verb->remaining()) {
      check(arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos,
            "unexpected argument '" + arg + "': overrides look like --section.key=value");
      overrides.push_back(arg);
    }
    for (const auto& [axis, value] : *layout)
      overrides.push_back("parallelism." + axis + "=" + std::to_string(value));
    if (*replica_group >= 0) overrides.push_back("replica.group=" + std::to_string(*replica_group));
    train::TrainConfig config = train::load_train_config(*config_path, overrides);
    train::TrainResult result = train::train_on_ranks(config);
    if (result.rank == 0 && !result.losses.empty())
      std::printf("done: %zu steps, final loss %.4f, %.0f tokens/s\n", result.losses.size(),
                  result.losses.back(), result.tokens_per_second);
  });
}

}  // namespace lattice::cli
