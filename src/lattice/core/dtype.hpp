// Element types (fp32, bf16, fp16, int32, int64, uint8) and exact bf16 <-> fp32 conversion.
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

}  // namespace lattice
