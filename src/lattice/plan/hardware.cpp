// Hardware catalog (see hardware.hpp). Figures are vendor datasheet numbers (dense, no sparsity).
#include "lattice/plan/hardware.hpp"

#include <toml++/toml.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "lattice/core/error.hpp"

namespace lattice::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGB = 1e9;
constexpr double kTera = 1e12;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text;
}

HardwareSpec entry(const char* name, const char* description, double bf16_tflops, double fp8_tflops,
                   double memory_bytes, double memory_tbs, double intra_gbs, int per_node,
                   double inter_gbs) {
  return {name,           description,       bf16_tflops * kTera, fp8_tflops * kTera,
          memory_bytes,   memory_tbs * 1e12, intra_gbs * kGB,     per_node,
          inter_gbs * kGB};
}

}  // namespace

const std::vector<HardwareSpec>& builtin_hardware() {
  // NVLink figures are the vendor's per-GPU total of both directions; network is one NIC per GPU
  // (HDR 200 Gb/s = 25 GB/s on DGX A100, NDR 400 Gb/s = 50 GB/s on DGX H100/H200/B200).
  static const std::vector<HardwareSpec> catalog = {
      entry("a100-40gb", "NVIDIA A100 SXM4 40GB", 312, 0, 40 * kGiB, 1.555, 600, 8, 25),
      entry("a100-80gb", "NVIDIA A100 SXM4 80GB", 312, 0, 80 * kGiB, 2.039, 600, 8, 25),
      entry("h100-sxm", "NVIDIA H100 SXM5 80GB", 989, 1979, 80 * kGiB, 3.35, 900, 8, 50),
      entry("h100-pcie", "NVIDIA H100 PCIe 80GB (PCIe Gen5 between GPUs)", 756, 1513, 80 * kGiB,
            2.0, 128, 8, 50),
      entry("h200", "NVIDIA H200 SXM 141GB", 989, 1979, 141 * kGB, 4.8, 900, 8, 50),
      entry("b200", "NVIDIA B200 SXM 192GB", 2250, 4500, 192 * kGB, 8.0, 1800, 8, 50),
      entry("gb200-nvl72", "NVIDIA GB200 NVL72 (72 GPUs in one NVLink domain)", 2500, 5000,
            186 * kGB, 8.0, 1800, 72, 100),
      entry("mi300x", "AMD Instinct MI300X 192GB", 1307, 2615, 192 * kGB, 5.3, 896, 8, 50),
      entry("rtx4090", "NVIDIA GeForce RTX 4090 24GB (PCIe Gen4, no NVLink)", 165.2, 330.3,
            24 * kGiB, 1.008, 64, 4, 12.5),
  };
  return catalog;
}

HardwareCatalog::HardwareCatalog() : entries_(builtin_hardware()) {}

void HardwareCatalog::add_or_replace(const HardwareSpec& spec) {
  for (auto& existing : entries_) {
    if (existing.name == spec.name) {
      existing = spec;
      return;
    }
  }
  entries_.push_back(spec);
}

std::vector<std::string> HardwareCatalog::names() const {
  std::vector<std::string> result;
  for (const auto& spec : entries_) result.push_back(spec.name);
  if (std::find(result.begin(), result.end(), "cpu") == result.end()) result.push_back("cpu");
  return result;
}

HardwareSpec HardwareCatalog::get(const std::string& name) {
  const std::string key = lower(name);
  for (const auto& spec : entries_)
    if (spec.name == key) return spec;
  if (key == "cpu") {
    entries_.push_back(calibrate_this_cpu());
    return entries_.back();
  }
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown GPU '" + name + "': use one of " + known +
              " (or add it with --hardware-file)");
}

void HardwareCatalog::load_toml_string(const std::string& text) {
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    throw Error(std::string("hardware file is not valid TOML: ") + std::string(e.description()));
  }
  const toml::table* gpus = root["gpu"].as_table();
  check(gpus != nullptr, "hardware file needs [gpu.<name>] tables");
  for (const auto& [key, node] : *gpus) {
    const toml::table* table = node.as_table();
    const std::string name = lower(std::string(key.str()));
    check(table != nullptr, "hardware entry gpu." + name + " must be a table");
    HardwareSpec spec;
    spec.name = name;
    if (auto base = (*table)["based_on"].value<std::string>()) {
      spec = get(*base);
      spec.name = name;
    } else {
      for (const auto& existing : entries_)
        if (existing.name == name) spec = existing;
    }
    static const char* kKnownKeys[] = {
        "description",     "based_on",         "peak_bf16_tflops",
        "peak_fp8_tflops", "memory_gib",       "memory_bandwidth_gbs",
        "intra_node_gbs",  "devices_per_node", "inter_node_gbs"};
    for (const auto& [field, value] : *table) {
      const auto found = std::find_if(std::begin(kKnownKeys), std::end(kKnownKeys),
                                      [&](const char* k) { return field.str() == k; });
      check(found != std::end(kKnownKeys),
            "unknown key gpu." + name + "." + std::string(field.str()) +
                ": use peak_bf16_tflops, peak_fp8_tflops, memory_gib, "
                "memory_bandwidth_gbs, intra_node_gbs, "
                "devices_per_node, inter_node_gbs");
    }
    auto number = [&](const char* field) -> std::optional<double> {
      const auto& n = (*table)[field];
      if (!n) return std::nullopt;
      if (auto v = n.value<double>()) return *v;
      throw Error("gpu." + name + "." + field + " must be a number");
    };
    if (auto v = (*table)["description"].value<std::string>()) spec.description = *v;
    if (auto v = number("peak_bf16_tflops")) spec.peak_bf16_flops = *v * kTera;
    if (auto v = number("peak_fp8_tflops")) spec.peak_fp8_flops = *v * kTera;
    if (auto v = number("memory_gib")) spec.memory_bytes = *v * kGiB;
    if (auto v = number("memory_bandwidth_gbs")) spec.memory_bandwidth = *v * kGB;
    if (auto v = number("intra_node_gbs")) spec.intra_node_bandwidth = *v * kGB;
    if (auto v = number("devices_per_node")) spec.devices_per_node = static_cast<int>(*v);
    if (auto v = number("inter_node_gbs")) spec.inter_node_bandwidth = *v * kGB;
    check(spec.peak_bf16_flops > 0 && spec.memory_bytes > 0 && spec.memory_bandwidth > 0 &&
              spec.intra_node_bandwidth > 0 && spec.devices_per_node >= 1 &&
              spec.inter_node_bandwidth > 0,
          "hardware entry gpu." + name +
              " is incomplete: give peak_bf16_tflops, memory_gib, memory_bandwidth_gbs, "
              "intra_node_gbs, "
              "devices_per_node and inter_node_gbs (or based_on)");
    add_or_replace(spec);
  }
}

void HardwareCatalog::load_toml_file(const std::string& path) {
  std::ifstream file(path);
  check(file.good(), "cannot read hardware file '" + path + "'");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  load_toml_string(text);
}

namespace {

// FLOP/s of one thread running independent fp32 FMA chains that the compiler vectorises.
double fma_flops_one_thread() {
  constexpr int kLanes = 64;
  alignas(64) float acc[kLanes];
  for (int i = 0; i < kLanes; ++i) acc[i] = 1.0f + i * 1e-7f;
  const float a = 0.999999f, b = 1e-7f;
  const auto start = std::chrono::steady_clock::now();
  constexpr long kIterations = 1 << 20;
  for (long it = 0; it < kIterations; ++it) {
#pragma omp simd
    for (int i = 0; i < kLanes; ++i) acc[i] = acc[i] * a + b;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float sink = 0;
  for (int i = 0; i < kLanes; ++i) sink = sink + acc[i];
  return 2.0 * kLanes * kIterations / std::max(seconds, 1e-9);
}

double copy_bandwidth() {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> source(bytes, 1), target(bytes, 0);
  std::memcpy(target.data(), source.data(), bytes);  // touch pages
  const auto start = std::chrono::steady_clock::now();
  for (int repeat = 0; repeat < 2; ++repeat) std::memcpy(target.data(), source.data(), bytes);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * 2.0 * bytes / std::max(seconds, 1e-9);  // read + write per copy
}

double physical_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024.0;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

}  // namespace

HardwareSpec calibrate_this_cpu() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  HardwareSpec spec;
  spec.name = "cpu";
  spec.description = "this machine's CPU (" + std::to_string(cores) + " cores, measured fp32 FMA)";
  spec.peak_bf16_flops = fma_flops_one_thread() * cores;
  spec.peak_fp8_flops = 0;
  spec.memory_bandwidth = copy_bandwidth();
  spec.memory_bytes = physical_memory_bytes();
  spec.intra_node_bandwidth = spec.memory_bandwidth;  // ranks on one machine share memory
  spec.devices_per_node = 1;
  spec.inter_node_bandwidth = 12.5e9;  // 100 Gb/s Ethernet, a common default
  return spec;
}

}  // namespace lattice::plan
