// Hardware catalog: accelerators with their peak dense FLOP/s, memory size and bandwidth,
// intra-node link (NVLink) and inter-node network bandwidth per device, plus "cpu" measured on this
// machine by a short calibration. Users add or override entries from a TOML file.
#pragma once

#include <string>
#include <vector>

namespace lattice::plan {

struct HardwareSpec {
  std::string name;             // catalog key, e.g. "a100-80gb"
  std::string description;      // e.g. "NVIDIA A100 SXM4 80GB"
  double peak_bf16_flops = 0;   // dense, per device
  double peak_fp8_flops = 0;    // dense, per device; 0 when the device has no fp8 units
  double memory_bytes = 0;      // device memory capacity
  double memory_bandwidth = 0;  // bytes/s
  double intra_node_bandwidth =
      0;                     // bytes/s per device, both directions summed (vendor NVLink figure)
  int devices_per_node = 1;  // devices sharing the intra-node link domain
  double inter_node_bandwidth = 0;  // bytes/s per device, one direction (InfiniBand/RoCE NIC share)
};

// Built-in entries: a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200, b200, gb200-nvl72, mi300x,
// rtx4090.
const std::vector<HardwareSpec>& builtin_hardware();

// A catalog: the built-in entries, optionally overridden or extended from TOML, and "cpu" on
// demand.
class HardwareCatalog {
 public:
  HardwareCatalog();  // the built-in entries

  // Reads a TOML file of [gpu.<name>] tables (keys: description, based_on, peak_bf16_tflops,
  // peak_fp8_tflops, memory_gib, memory_bandwidth_gbs, intra_node_gbs, devices_per_node,
  // inter_node_gbs). An existing name is overridden key by key; `based_on` copies another entry
  // first.
  void load_toml_file(const std::string& path);
  void load_toml_string(const std::string& text);

  // A copy of the entry for `name` (case-insensitive; "cpu" calibrates this machine on first use).
  // Throws lattice::Error naming the known entries when there is none.
  HardwareSpec get(const std::string& name);
  std::vector<std::string> names() const;
  void add_or_replace(const HardwareSpec& spec);

 private:
  std::vector<HardwareSpec> entries_;
};

// Measures this CPU: FLOP/s of a vectorised fp32 FMA loop on all cores, memory copy bandwidth, RAM
// size. Takes about a tenth of a second.
HardwareSpec calibrate_this_cpu();

}  // namespace lattice::plan
