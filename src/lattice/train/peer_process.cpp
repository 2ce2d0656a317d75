// Running a benchmark's peer process: see peer_process.hpp.
#include "lattice/train/peer_process.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <cstring>

namespace lattice::train {

int run_captured(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  char buffer[4096];
  while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, got);
  return pclose(pipe);
}

std::string tail_line(const std::string& output, size_t n) {
  std::string tail = output.substr(output.size() > n ? output.size() - n : 0);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  std::string line;
  for (char ch : tail) line += ch == '\n' ? std::string(" | ") : std::string(1, ch);
  return line;
}

nlohmann::json last_json_line(const std::string& output, const std::string& key) {
  const auto at = output.rfind("{\"" + key + "\"");
  if (at == std::string::npos) return nullptr;
  const auto end = output.find('\n', at);
  return nlohmann::json::parse(output.substr(at, end == std::string::npos ? end : end - at),
                               nullptr, /*allow_exceptions=*/false);
}

std::string peer_failure(const std::string& what, int status, const std::string& output) {
  const auto error = last_json_line(output, "error");
  if (error.is_object() && error.at("error").is_string())
    return what + " failed: " + error.at("error").get<std::string>();
  // The command runs under `sh -c`: a child killed by a signal shows as the shell's exit status
  // 128 + the signal (or the shell itself was killed by it).
  int signal = 0;
  if (status != -1 && WIFSIGNALED(status)) signal = WTERMSIG(status);
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) > 128 &&
      WEXITSTATUS(status) < 128 + 64)
    signal = WEXITSTATUS(status) - 128;
  if (signal != 0) {
    std::string line = what + " crashed: killed by signal " + std::to_string(signal) + " (" +
                       strsignal(signal) + ")";
    const std::string tail = tail_line(output, 200);
    return tail.empty() ? line : line + "; its last output: " + tail;
  }
  const char* const install =
      "run `bash scripts/install_peers.sh` for PyTorch's venv, or pass --python a python with "
      "torch";
  const bool no_torch = output.find("No module named 'torch'") != std::string::npos ||
                        output.find("No module named torch") != std::string::npos;
  const bool no_python =
      status == -1 ||
      (WIFEXITED(status) && (WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 126));
  if (no_torch) return what + ": no torch in this python (" + install + ")";
  if (no_python)
    return what + ": this python could not be started (" + install + "): " + tail_line(output, 200);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : status;
  return what + " exited with status " + std::to_string(code) +
         " and no result: " + tail_line(output);
}

}  // namespace lattice::train
