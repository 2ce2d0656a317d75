// The benchmarks' host description, median and timing options: see bench_host.hpp.
#include "bench_host.hpp"

#include <algorithm>
#include <fstream>

namespace lattice::cli {

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown CPU", flags;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    const std::string value =
        colon == std::string::npos || colon + 2 > line.size() ? "" : line.substr(colon + 2);
    if (line.rfind("model name", 0) == 0 && name == "unknown CPU") name = value;
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + value + " ";
  }
  std::string isa;
  for (const char* flag : {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    if (flags.find(" " + std::string(flag) + " ") != std::string::npos)
      isa += (isa.empty() ? "" : " ") + std::string(flag);
  return name + " | ISA: " + (isa.empty() ? "none of avx2/avx512f/amx" : isa);
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
