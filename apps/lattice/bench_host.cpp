// The benchmarks' host description, median and timing options: see bench_host.hpp.
#include "bench_host.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace lattice::cli {

namespace {

// The first value of each key in /proc/cpuinfo ("model name", "flags", "cpu family", ...).
std::map<std::string, std::string> cpuinfo_fields() {
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> fields;
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    fields.emplace(key, colon + 2 <= line.size() ? line.substr(colon + 2) : "");
  }
  return fields;
}

std::string field_or(const std::map<std::string, std::string>& fields, const std::string& key,
                     const std::string& fallback) {
  const auto found = fields.find(key);
  return found == fields.end() ? fallback : found->second;
}

}  // namespace

std::string cpu_description() {
  const auto fields = cpuinfo_fields();
  const std::string name = field_or(fields, "model name", "unknown CPU");
  const std::string flags = " " + field_or(fields, "flags", "") + " ";
  std::string isa;
  for (const char* flag : {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    if (flags.find(" " + std::string(flag) + " ") != std::string::npos)
      isa += (isa.empty() ? "" : " ") + std::string(flag);
  return name + " | ISA: " + (isa.empty() ? "none of avx2/avx512f/amx" : isa);
}

std::string cpu_model() {
  const auto fields = cpuinfo_fields();
  const std::string name = field_or(fields, "model name", "unknown CPU");
  if (!fields.count("cpu family")) return name;
  return name + " (family " + fields.at("cpu family") + ", model " +
         field_or(fields, "model", "?") + ", stepping " + field_or(fields, "stepping", "?") + ")";
}

std::string find_repository_file(const std::string& relative) {
  for (auto dir = std::filesystem::current_path(); !dir.empty(); dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / relative)) return (dir / relative).string();
    if (dir == dir.parent_path()) break;
  }
  return "";
}

std::string load_average() {
  std::ifstream load("/proc/loadavg");
  std::string line;
  std::getline(load, line);
  return line;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void add_timing_options(CLI::App& target, int64_t& steps, int64_t& warmup, int64_t& rounds) {
  target.add_option("--steps", steps, "timed calls per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target.add_option("--warmup", warmup, "untimed calls first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  target.add_option("--rounds", rounds, "alternations (medians)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->capture_default_str();
}

}  // namespace lattice::cli
