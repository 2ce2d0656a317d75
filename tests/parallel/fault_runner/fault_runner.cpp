// The program the fault tests run in place of `lattice train` (alone, or as every process under
// mpirun): it installs a train::FaultInjection from its own flags, then trains as `lattice train`
// does with the rest of its arguments.
//
//   lattice_fault_runner [fault flags] train [config.toml] [--section.key=value ...] [--dp N ...]
//
// Fault flags (each a world rank and a step; see lattice/train/fault_injection.hpp):
//   --kill-rank=R --kill-after-step=S                 rank R dies (SIGKILL) after step S
//   --stall-rank=R --stall-before-step=S [--stall-seconds=X]   rank R sleeps X s (5) before S
//   --kill-during-save-rank=R --kill-during-save-step=S   rank R dies writing step S's checkpoint
// Errors print one "error: ..." line and exit with status 2, as the CLI's do.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/fault_injection.hpp"
#include "lattice/train/trainer.hpp"

namespace {

using lattice::check;

// The value of `--name=value` when `arg` is that flag.
bool flag_value(const std::string& arg, const std::string& name, std::string& value) {
  const std::string prefix = "--" + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  value = arg.substr(prefix.size());
  return true;
}

int run(const std::vector<std::string>& args) {
  lattice::train::FaultInjection faults;
  size_t i = 0;
  for (; i < args.size() && args[i] != "train"; ++i) {
    const std::string& arg = args[i];
    std::string v;
    if (flag_value(arg, "kill-rank", v))
      faults.kill_after_step.rank = std::stoi(v);
    else if (flag_value(arg, "kill-after-step", v))
      faults.kill_after_step.step = std::stoll(v);
    else if (flag_value(arg, "stall-rank", v))
      faults.stall_before_step.rank = std::stoi(v);
    else if (flag_value(arg, "stall-before-step", v))
      faults.stall_before_step.step = std::stoll(v);
    else if (flag_value(arg, "stall-seconds", v))
      faults.stall_seconds = std::stod(v);
    else if (flag_value(arg, "kill-during-save-rank", v))
      faults.kill_during_save.rank = std::stoi(v);
    else if (flag_value(arg, "kill-during-save-step", v))
      faults.kill_during_save.step = std::stoll(v);
    else
      throw lattice::Error("unknown fault flag '" + arg + "': see tests/parallel/fault_runner/");
  }
  check(i < args.size(), "no 'train' among the arguments: lattice_fault_runner [faults] train ...");
  // `lattice train`'s arguments: a config file, --section.key=value overrides, and the layout's
  // short flags (--dp N means --parallelism.dp=N; appended after the overrides, as there).
  std::string config_path;
  std::vector<std::string> overrides, layout;
  for (++i; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool short_flag = false;
    for (const char* axis : {"dp", "tp", "pp", "cp", "ep", "zero"}) {
      const std::string name = std::string("--") + axis;
      std::string v;
      if (arg == name) {
        check(i + 1 < args.size(), name + " needs a value");
        v = args[++i];
      } else if (!flag_value(arg, axis, v)) {
        continue;
      }
      layout.push_back(std::string("parallelism.") + axis + "=" + v);
      short_flag = true;
      break;
    }
    if (short_flag) continue;
    if (arg.rfind("--", 0) == 0) {
      check(arg.find('=') != std::string::npos,
            "unexpected argument '" + arg + "': overrides look like --section.key=value");
      overrides.push_back(arg);
    } else {
      check(config_path.empty(), "unexpected argument '" + arg + "': one config file at most");
      config_path = arg;
    }
  }
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  const lattice::train::TrainConfig config =
      lattice::train::load_train_config(config_path, overrides);
  const lattice::train::TrainResult result = lattice::train::train_on_ranks(config, faults);
  if (result.rank == 0 && !result.losses.empty())
    std::printf("done: %zu steps, final loss %.4f, %.0f tokens/s\n", result.losses.size(),
                result.losses.back(), result.tokens_per_second);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
