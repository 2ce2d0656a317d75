// Aligned heap blocks: see aligned_allocation.hpp.
#include "lattice/core/aligned_allocation.hpp"

#include <sys/mman.h>

#include <cstdlib>

namespace lattice {

void* allocate_aligned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < kHugePageThresholdBytes) return std::aligned_alloc(64, rounded);
  void* block = nullptr;
  if (posix_memalign(&block, kHugePageThresholdBytes, rounded) != 0) return nullptr;
  // Advice only: where Linux has no huge pages to give, the block keeps 4 KiB pages. The advice
  // covers the block alone, so a partial last 2 MiB stays in small pages and costs no extra RSS.
  madvise(block, rounded, MADV_HUGEPAGE);
  return block;
}

void free_aligned(void* block) noexcept {
  std::free(block);
}

}  // namespace lattice
