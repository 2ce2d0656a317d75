// Running a benchmark's peer process: see peer_process.hpp.
#include "lattice/train/peer_process.hpp"

#include <cstdio>

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

}  // namespace lattice::train
