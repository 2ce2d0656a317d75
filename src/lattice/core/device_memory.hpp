// DeviceMemory: the memory of one device, as a kernel backend hands it out — allocation, freeing,
// zero-fill, giving pages back, and copies (whole or row by row) between it and the host or within
// it. Tensors built on one
// (Tensor(shape, dtype, memory, ...)) live in it; kernels::Ops::memory() is the backend's. The
// host's is HostMemory (64-byte-aligned blocks of aligned_allocation.hpp, memset, memcpy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lattice/core/device.hpp"

namespace lattice {

// Which memories a copy moves between ("device": the DeviceMemory's own; on the host's memory all
// three are plain copies).
enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device };

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  // At least `bytes` bytes, 64-byte aligned, zero-filled; nullptr for 0 bytes. Throws
  // std::bad_alloc when the device is out of memory.
  virtual void* allocate(size_t bytes) = 0;
  // Frees a block from allocate (nullptr is ignored).
  virtual void free(void* block) noexcept = 0;
  virtual void zero(void* data, size_t bytes) = 0;
  // Zeroes `bytes` bytes inside a live block and may hand the whole pages among them back to the
  // device until they are written again (ZeRO-2/3 keep their flat buffers as address space but
  // release a bucket once it is reduced or sharded). The range reads zero afterwards.
  virtual void release(void* data, size_t bytes) = 0;
  // `bytes` bytes from `source` to `destination`; the two do not overlap.
  virtual void copy(void* destination, const void* source, size_t bytes, CopyKind kind) = 0;
  // `rows` runs of `row_bytes` bytes, run r from source + r·source_pitch to destination +
  // r·destination_pitch (cudaMemcpy2D's shape: packing rows of a strided tensor into a contiguous
  // message, or back); nothing overlaps.
  virtual void copy_rows(void* destination, size_t destination_pitch, const void* source,
                         size_t source_pitch, size_t row_bytes, size_t rows, CopyKind kind) = 0;
};

// The host's memory. Stateless: one instance serves every caller.
class HostMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override;
  void free(void* block) noexcept override;
  void zero(void* data, size_t bytes) override;
  // Whole pages go back to the kernel (madvise MADV_DONTNEED: private anonymous pages read back
  // as zeros and cost no resident memory until touched); the partial pages at the ends are zeroed.
  void release(void* data, size_t bytes) override;
  void copy(void* destination, const void* source, size_t bytes, CopyKind kind) override;
  void copy_rows(void* destination, size_t destination_pitch, const void* source,
                 size_t source_pitch, size_t row_bytes, size_t rows, CopyKind kind) override;
};

// The stateless host memory every cpu tensor is allocated from.
HostMemory& host_memory();

// The error for storage on `device` when no backend of this build allocates there: one line
// naming the device and the fix ("... no CUDA backend is built; ...").
std::string no_backend_message(Device device, const std::string& what);

}  // namespace lattice
