// Test helpers for the `lattice` CLI: run the binary (or another program, such as the fault tests'
// runner) with arguments (exit status, stdout, stderr),
// read a metrics JSONL file, and expect the one-line error that bad input must produce.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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

// Runs `program` with `args` (a shell-quoted string) inside `workdir`, with stdin read from
// `stdin_file` (a path relative to workdir).
inline CliResult run_program(const std::string& program, const std::string& args,
                             const std::filesystem::path& workdir,
                             const std::string& stdin_file = "/dev/null") {
  const auto out = workdir / "cli.out", err = workdir / "cli.err";
  const std::string command = "cd '" + workdir.string() + "' && '" + program + "' " + args +
                              " > '" + out.string() + "' 2> '" + err.string() + "' < '" +
                              stdin_file + "'";
  int raw = std::system(command.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// run_program of LATTICE_BINARY, the `lattice` CLI.
inline CliResult run_lattice(const std::string& args, const std::filesystem::path& workdir,
                             const std::string& stdin_file = "/dev/null") {
  return run_program(LATTICE_BINARY, args, workdir, stdin_file);
}

// The records of a JSONL file (the run directory's metrics.jsonl).
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

inline int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// Bad input's contract: exit status 2 and exactly one "error: ..." line containing `needle`.
inline void expect_one_error_line(const CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

// Three English sentences, 300 lines: a corpus a tiny model learns something from in a few steps.
inline void write_small_corpus(const std::filesystem::path& path) {
  std::ofstream out(path);
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n",
                         "A stitch in time saves nine.\n", "All that glitters is not gold.\n"};
  for (int i = 0; i < 300; ++i) out << lines[i % 3];
}

// A fresh empty directory under the system temp folder.
inline std::filesystem::path fresh_directory(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("lattice-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A fresh_directory that is removed with everything in it when this goes out of scope.
class TemporaryDirectory {
 public:
  explicit TemporaryDirectory(const std::string& name) : path_(fresh_directory(name)) {}
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace lattice::testing
