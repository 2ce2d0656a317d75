// Test helper: runs the `lattice` binary with arguments, capturing exit status, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace lattice::testing {

struct CliResult {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs LATTICE_BINARY with `args` (a shell-quoted string) inside `workdir`.
inline CliResult run_lattice(const std::string& args, const std::filesystem::path& workdir) {
  const auto out = workdir / "cli.out", err = workdir / "cli.err";
  const std::string command = "cd '" + workdir.string() + "' && '" + std::string(LATTICE_BINARY) +
                              "' " + args + " > '" + out.string() + "' 2> '" + err.string() +
                              "' < /dev/null";
  int raw = std::system(command.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A fresh empty directory under the system temp folder.
inline std::filesystem::path fresh_directory(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("lattice-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace lattice::testing
