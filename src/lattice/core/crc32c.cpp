// CRC-32C: see crc32c.hpp.
#include "lattice/core/crc32c.hpp"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include <cstring>

namespace lattice {
namespace {

#if !defined(__SSE4_2__)
uint32_t crc32c_byte(uint32_t crc, uint8_t byte) {
  crc ^= byte;
  for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  return crc;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t nbytes, uint32_t crc) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint64_t state = ~crc;
  size_t i = 0;
#if defined(__SSE4_2__)
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    state = _mm_crc32_u64(state, word);
  }
  for (; i < nbytes; ++i) state = _mm_crc32_u8(static_cast<uint32_t>(state), bytes[i]);
#else
  for (; i < nbytes; ++i) state = crc32c_byte(static_cast<uint32_t>(state), bytes[i]);
#endif
  return ~static_cast<uint32_t>(state);
}

}  // namespace lattice
