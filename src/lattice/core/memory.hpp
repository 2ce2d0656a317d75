// Memory accounting: tracked bytes per category (parameters, gradients, optimizer state,
// activations) with current and peak values, plus the process resident set size read from /proc.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace lattice {

enum class MemoryCategory : uint8_t { parameters, gradients, optimizer_state, activations, other };
inline constexpr int kMemoryCategoryCount = 5;

std::string_view memory_category_name(MemoryCategory category);

// Thread-safe counters of live and peak bytes per category. Owned by whoever runs a model (the
// trainer, a test); tensors report to it when they are given one.
class MemoryTracker {
 public:
  void add(MemoryCategory category, int64_t bytes);
  void remove(MemoryCategory category, int64_t bytes);
  int64_t current(MemoryCategory category) const;
  int64_t peak(MemoryCategory category) const;
  int64_t current_total() const;
  int64_t peak_total() const;  // peak of the sum, not the sum of peaks

 private:
  std::array<std::atomic<int64_t>, kMemoryCategoryCount> current_{};
  std::array<std::atomic<int64_t>, kMemoryCategoryCount> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

// Resident set size of this process in bytes (VmRSS), and its high-water mark (VmHWM); 0 if
// unknown.
int64_t process_rss_bytes();
int64_t process_peak_rss_bytes();

}  // namespace lattice
