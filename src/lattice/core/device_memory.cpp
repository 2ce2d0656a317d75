// The host's DeviceMemory and the no-backend message: see device_memory.hpp.
#include "lattice/core/device_memory.hpp"

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

void HostMemory::copy(void* destination, const void* source, size_t bytes, CopyKind /*kind*/) {
  if (bytes) std::memcpy(destination, source, bytes);
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
