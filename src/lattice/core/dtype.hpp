// Element types (fp32, bf16, fp16, int32, int64, uint8) and exact bf16/fp16 <-> fp32 conversion.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lattice {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

// bfloat16 stored as its 16 raw bits (the top half of an IEEE fp32).
struct bf16 {
  uint16_t bits = 0;
};

// fp32 -> bf16 with round-to-nearest-even; NaN stays NaN (quiet), infinities stay infinite.
inline bf16 to_bf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// bf16 -> fp32 is exact.
inline float to_float(bf16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

// fp32 value rounded through bf16 and back (what a bf16 store then load gives).
inline float round_to_bf16(float value) {
  return to_float(to_bf16(value));
}

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

}  // namespace lattice
