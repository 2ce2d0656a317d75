// Running a benchmark's peer process (a PyTorch script through a python): its exit status and
// output, the last line of its output as JSON, and a one-line tail of it for an error message.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace lattice::train {

// Runs a shell command; its exit status (as pclose returns it, -1 when it could not start), with
// its stdout and stderr in `output`.
int run_captured(const std::string& command, std::string& output);

// The last `n` characters of a command's output on one line (newlines as " | ").
std::string tail_line(const std::string& output, size_t n = 300);

// The JSON object of the last line of `output` that starts with `{"<key>"`, or null.
nlohmann::json last_json_line(const std::string& output, const std::string& key);

}  // namespace lattice::train
