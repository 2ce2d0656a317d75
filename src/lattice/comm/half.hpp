// IEEE fp16 <-> fp32 conversion in software (exact widening, round-to-nearest-even narrowing).
#pragma once

#include <bit>
#include <cstdint>

namespace lattice::comm {

// fp16 stored as its 16 raw bits.
struct f16 {
  uint16_t bits = 0;
};

// fp16 -> fp32 is exact (subnormals, infinities and NaN included).
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: value = mantissa * 2^-24, exact in fp32
    float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    bits = sign | std::bit_cast<uint32_t>(magnitude);
  }
  return std::bit_cast<float>(bits);
}

// fp32 -> fp16 with round-to-nearest-even; overflow becomes infinity, NaN stays NaN (quiet).
inline uint16_t float_to_f16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (magnitude < 0x38800000u) {  // result is subnormal or zero: round value * 2^24 to an integer
    float scaled = std::bit_cast<float>(magnitude) * 0x1p24f;
    // nearest-even rounding of a float in [0, 1024] via the 2^23 trick
    float rounded = (scaled + 0x1p23f) - 0x1p23f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  uint32_t rounding_bias = 0xfffu + ((magnitude >> 13) & 1u);
  uint32_t rebased = magnitude - (112u << 23) + rounding_bias;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rebased >> 13));
}

}  // namespace lattice::comm
