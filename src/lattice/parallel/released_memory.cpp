// Releasing pages inside a buffer: see released_memory.hpp.
#include "lattice/parallel/released_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace lattice::parallel {

void release_floats(float* data, int64_t count) {
  if (count <= 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + static_cast<uintptr_t>(count) * sizeof(float);
  const uintptr_t first_page = (begin + page - 1) / page * page, last_page = end / page * page;
  if (last_page <= first_page) {
    std::memset(data, 0, static_cast<size_t>(end - begin));
    return;
  }
  std::memset(data, 0, first_page - begin);
  std::memset(reinterpret_cast<void*>(last_page), 0, end - last_page);
  // Private anonymous memory: the released pages read back as zeros on the next touch.
  if (madvise(reinterpret_cast<void*>(first_page), last_page - first_page, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(first_page), 0, last_page - first_page);
}

}  // namespace lattice::parallel
