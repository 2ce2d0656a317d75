// Memory accounting: see memory.hpp.
#include "lattice/core/memory.hpp"

#include <fstream>
#include <string>

namespace lattice {

std::string_view memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters:
      return "parameters";
    case MemoryCategory::gradients:
      return "gradients";
    case MemoryCategory::optimizer_state:
      return "optimizer_state";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::other:
      return "other";
  }
  return "?";
}

static void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::add(MemoryCategory category, int64_t bytes) {
  auto index = static_cast<size_t>(category);
  raise_peak(peak_[index], current_[index].fetch_add(bytes) + bytes);
  raise_peak(peak_total_, total_.fetch_add(bytes) + bytes);
}

void MemoryTracker::remove(MemoryCategory category, int64_t bytes) {
  current_[static_cast<size_t>(category)].fetch_sub(bytes);
  total_.fetch_sub(bytes);
}

int64_t MemoryTracker::current(MemoryCategory category) const {
  return current_[static_cast<size_t>(category)].load();
}
int64_t MemoryTracker::peak(MemoryCategory category) const {
  return peak_[static_cast<size_t>(category)].load();
}
int64_t MemoryTracker::current_total() const {
  return total_.load();
}
int64_t MemoryTracker::peak_total() const {
  return peak_total_.load();
}

static int64_t read_status_kib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  }
  return 0;
}

int64_t process_rss_bytes() {
  return read_status_kib("VmRSS:");
}
int64_t process_peak_rss_bytes() {
  return read_status_kib("VmHWM:");
}

}  // namespace lattice
