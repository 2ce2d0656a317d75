// Aligned heap blocks: see aligned_allocation.hpp.
#include "lattice/core/aligned_allocation.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

namespace lattice {

namespace {

// Blocks of kMappedThresholdBytes (the huge-page threshold) and more are mapped here directly and
// kept after they are freed, for the next allocation of the same size: a training step frees and
// reallocates the same activation blocks every step, and a fresh mapping costs a page fault and
// the kernel's zeroing of every huge page. glibc maps blocks of 32 MiB and more anew on every
// allocation, and gives the smaller ones' pages back when it trims its heap: on the small bench
// shape in bf16 the zeroing of those refaulted 2-32 MiB blocks took 7.5% of the step.
constexpr size_t kMappedThresholdBytes = kHugePageThresholdBytes;
// Freed blocks are kept while the cache holds less than this; beyond it they are unmapped.
constexpr size_t kCacheLimitBytes = size_t{8} << 30;

// The process's cache of large mapped blocks: like malloc's own state, one per process (every
// tensor in the process allocates through it), guarded by a mutex.
class MappedBlockCache {
 public:
  void* take(size_t bytes) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto found = free_.find(bytes);
      if (found != free_.end()) {
        void* block = found->second;
        free_.erase(found);
        cached_bytes_ -= bytes;
        return block;
      }
    }
    void* block = map_aligned(bytes);
    if (block != nullptr) {
      const std::lock_guard<std::mutex> lock(mutex_);
      sizes_[block] = bytes;
    }
    return block;
  }

  // True when `block` is one of the cache's mappings (it is then kept or unmapped here).
  bool give_back(void* block) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto known = sizes_.find(block);
    if (known == sizes_.end()) return false;
    const size_t bytes = known->second;
    if (cached_bytes_ + bytes <= kCacheLimitBytes) {
      free_.emplace(bytes, block);
      cached_bytes_ += bytes;
    } else {
      sizes_.erase(known);
      munmap(block, bytes);
    }
    return true;
  }

 private:
  // A mapping of `bytes` (a multiple of 2 MiB) aligned to 2 MiB: map 2 MiB more and unmap the
  // ends. Fresh anonymous pages are zero; huge pages are advised.
  static void* map_aligned(size_t bytes) {
    const size_t slack = kHugePageThresholdBytes;
    void* raw =
        mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + slack - 1) / slack * slack;
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + bytes + slack;
    if (end > aligned + bytes)
      munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
    void* block = reinterpret_cast<void*>(aligned);
    madvise(block, bytes, MADV_HUGEPAGE);
    return block;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> sizes_;
  size_t cached_bytes_ = 0;
};

MappedBlockCache& mapped_blocks() {
  static MappedBlockCache cache;
  return cache;
}

}  // namespace

void* allocate_aligned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < kHugePageThresholdBytes) return std::aligned_alloc(64, rounded);
  if (rounded >= kMappedThresholdBytes) {
    if (rounded > SIZE_MAX / 4) return nullptr;  // no machine has it; keeps the sums below exact
    const size_t pages =
        (rounded + kHugePageThresholdBytes - 1) / kHugePageThresholdBytes * kHugePageThresholdBytes;
    return mapped_blocks().take(pages);
  }
  void* block = nullptr;
  if (posix_memalign(&block, kHugePageThresholdBytes, rounded) != 0) return nullptr;
  // Advice only: where Linux has no huge pages to give, the block keeps 4 KiB pages. The advice
  // covers the block alone, so a partial last 2 MiB stays in small pages and costs no extra RSS.
  madvise(block, rounded, MADV_HUGEPAGE);
  return block;
}

void free_aligned(void* block) noexcept {
  if (block == nullptr) return;
  // Mapped blocks are 2 MiB aligned: anything else came from malloc, no lookup needed.
  const bool maybe_mapped = reinterpret_cast<uintptr_t>(block) % kHugePageThresholdBytes == 0;
  if (!maybe_mapped || !mapped_blocks().give_back(block)) std::free(block);
}

}  // namespace lattice
