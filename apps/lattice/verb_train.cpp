// The `lattice train` verb: `lattice train [config.toml] [--section.key=value ...] [--dp N ...]`.
#include <cstdio>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_train_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "train", "Train a model from a TOML config; any key can be overridden as --section.key=value");
  auto config_path = std::make_shared<std::string>();
  verb->add_option("config", *config_path, "TOML configuration file");
  verb->allow_extras();
  verb->callback([verb, config_path] {
    std::vector<std::string> overrides;
    const std::vector<std::string> extras = verb->remaining();
    // Short flags for the layout: --dp N (or --dp=N) means --parallelism.dp=N.
    for (size_t i = 0; i < extras.size(); ++i) {
      std::string arg = extras[i];
      bool layout = false;
      for (const char* flag : {"--dp", "--tp", "--pp", "--cp", "--ep", "--zero"}) {
        std::string f(flag);
        if (arg == f || arg.rfind(f + "=", 0) == 0) {
          std::string value;
          if (arg == f) {
            check(i + 1 < extras.size(), f + " needs a value, e.g. " + f + " 2");
            value = extras[++i];
          } else {
            value = arg.substr(f.size() + 1);
          }
          overrides.push_back("parallelism." + f.substr(2) + "=" + value);
          layout = true;
        }
      }
      if (layout) continue;
      check(arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos,
            "unexpected argument '" + arg + "': overrides look like --section.key=value");
      overrides.push_back(arg);
    }
    train::TrainConfig config = train::load_train_config(*config_path, overrides);
    train::Trainer trainer(config);
    train::TrainResult result = trainer.run();
    if (!result.losses.empty())
      std::printf("done: %zu steps, final loss %.4f, %.0f tokens/s\n", result.losses.size(),
                  result.losses.back(), result.tokens_per_second);
  });
}

}  // namespace lattice::cli
