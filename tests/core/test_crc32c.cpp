// CRC-32C (core/crc32c.hpp), the checksum of the optimizer offload and of TensorBoard's records:
// the standard check value, continuation, and agreement with the bitwise definition on a long
// buffer (the SSE4.2 path takes 8 bytes at a time).
#include "lattice/core/crc32c.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

// The definition: reflected polynomial 0x82F63B78, one bit at a time.
uint32_t bitwise_crc32c(const std::vector<uint8_t>& bytes) {
  uint32_t crc = ~0u;
  for (uint8_t byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

TEST(Crc32c, MatchesTheStandardCheckValue) {
  // The CRC-32C check value of "123456789" (RFC 3720).
  EXPECT_EQ(lattice::crc32c("123456789", 9), 0xE3069283u);
  // Continuation equals one pass.
  EXPECT_EQ(lattice::crc32c("6789", 4, lattice::crc32c("12345", 5)), 0xE3069283u);
}

TEST(Crc32c, MatchesTheBitwiseDefinitionOnEveryLength) {
  std::vector<uint8_t> bytes;
  for (int n = 0; n < 300; ++n) {
    EXPECT_EQ(lattice::crc32c(bytes.data(), bytes.size()), bitwise_crc32c(bytes)) << n;
    bytes.push_back(static_cast<uint8_t>(n * 37 + 11));
  }
}
