// CRC-32C (Castagnoli): the checksum the optimizer offload stores per chunk and TensorBoard's
// record framing uses (TFRecord), hardware-accelerated where the build has SSE4.2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lattice {

// CRC-32C of `nbytes` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t nbytes, uint32_t crc = 0);

}  // namespace lattice
