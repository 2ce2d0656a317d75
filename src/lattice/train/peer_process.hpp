// Running a benchmark's peer process (a PyTorch script through a python): its exit status and
// output, the last line of its output as JSON, a one-line tail of it, and the reason it failed in
// one line: its own error report, a crash by a signal, a python without torch, or its exit status.
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

// Why a peer run that printed no result failed, named by its cause: the peer's own {"error": ...}
// line ("<what> failed: ..."), a crash ("<what> crashed: killed by signal 11 (Segmentation
// fault)"), a python without torch or one that cannot start (with how to install the peer), or
// else its exit status and the tail of its output. `status` as run_captured returns it.
std::string peer_failure(const std::string& what, int status, const std::string& output);

}  // namespace lattice::train
