// The host's DeviceMemory and the no-backend message: see device_memory.hpp.
#include "lattice/core/device_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "lattice/core/aligned_allocation.hpp"

namespace lattice {

std::string_view device_name(Device device) {
  switch (device) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

void* HostMemory::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t padded = (bytes + 63) / 64 * 64;
  void* block = allocate_aligned(padded);
  if (!block) throw std::bad_alloc();
  std::memset(block, 0, padded);
  return block;
}

void HostMemory::free(void* block) noexcept {
  free_aligned(block);
}

void HostMemory::zero(void* data, size_t bytes) {
  if (bytes) std::memset(data, 0, bytes);
}

void HostMemory::release(void* data, size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + bytes;
  const uintptr_t first_page = (begin + page - 1) / page * page, last_page = end / page * page;
  if (last_page <= first_page) {
    std::memset(data, 0, bytes);
    return;
  }
  std::memset(data, 0, first_page - begin);
  std::memset(reinterpret_cast<void*>(last_page), 0, end - last_page);
  // Private anonymous memory: the released pages read back as zeros on the next touch.
  if (madvise(reinterpret_cast<void*>(first_page), last_page - first_page, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(first_page), 0, last_page - first_page);
}

void HostMemory::copy(void* destination, const void* source, size_t bytes, CopyKind /*kind*/) {
  if (bytes) std::memcpy(destination, source, bytes);
}

void HostMemory::copy_rows(void* destination, size_t destination_pitch, const void* source,
                           size_t source_pitch, size_t row_bytes, size_t rows, CopyKind /*kind*/) {
  if (row_bytes == 0) return;
  auto* to = static_cast<char*>(destination);
  const auto* from = static_cast<const char*>(source);
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(to + r * destination_pitch, from + r * source_pitch, row_bytes);
}

HostMemory& host_memory() {
  static HostMemory memory;  // stateless
  return memory;
}

std::string no_backend_message(Device device, const std::string& what) {
  if (device == Device::cuda)
    return what +
           " on cuda: no CUDA backend is built; run on the cpu (Device::cpu), or build "
           "Lattice with a CUDA backend (kernels/cuda) to use the GPU";
  return what + " on " + std::string(device_name(device)) +
         ": no backend for that device is built; run on the cpu (Device::cpu)";
}

}  // namespace lattice
