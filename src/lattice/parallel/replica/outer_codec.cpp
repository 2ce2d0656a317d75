// OuterCodec: see outer_codec.hpp.
#include "lattice/parallel/replica/outer_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"

namespace lattice::replica {

namespace {

// E2M1's magnitudes by code (the sign is bit 3), and the midpoints between neighbours.
constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr float kMidpoints[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
constexpr int64_t kFp4BlockBytes = 1 + kFp4Block / 2;

// The code of the grid point nearest to |x| (a tie goes to the smaller magnitude), with x's sign.
uint8_t fp4_code(float x) {
  const float magnitude = std::fabs(x);
  uint8_t code = 0;
  while (code < 7 && magnitude > kMidpoints[code]) ++code;
  return static_cast<uint8_t>(code | (std::signbit(x) && code != 0 ? 8 : 0));
}

// The smallest power-of-two exponent e with amax <= 6·2^e (amax > 0, finite), clamped to E8M0's.
int fp4_exponent(float amax) {
  int k = 0;
  const float m = std::frexp(amax / 6.0f, &k);  // amax / 6 = m·2^k, m in [0.5, 1)
  int e = m == 0.5f ? k - 1 : k;
  if (amax > std::ldexp(6.0f, e)) ++e;  // the division's rounding
  return std::clamp(e, -127, 127);
}

void encode_fp4(const float* values, int64_t count, uint8_t* out) {
  for (int64_t begin = 0; begin < count; begin += kFp4Block) {
    const int64_t n = std::min(kFp4Block, count - begin);
    uint8_t* block = out + begin / kFp4Block * kFp4BlockBytes;
    std::memset(block, 0, kFp4BlockBytes);
    float amax = 0;
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) {
      finite &= std::isfinite(values[begin + i]);
      amax = std::max(amax, std::fabs(values[begin + i]));
    }
    check(finite,
          "diloco: an outer gradient is not finite (the inner training "
          "diverged): lower optimizer.lr, or resume from an earlier "
          "checkpoint");
    if (amax == 0) continue;  // scale byte 0 and zero codes: zeros
    const int e = fp4_exponent(amax);
    block[0] = static_cast<uint8_t>(e + 127);
    const float inverse = std::ldexp(1.0f, -e);  // a power of two: x·2^-e is exact
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t code = fp4_code(values[begin + i] * inverse);
      block[1 + i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? code : code << 4);
    }
  }
}

void decode_add_fp4(const uint8_t* in, int64_t count, float* sum) {
  for (int64_t begin = 0; begin < count; begin += kFp4Block) {
    const int64_t n = std::min(kFp4Block, count - begin);
    const uint8_t* block = in + begin / kFp4Block * kFp4BlockBytes;
    const float scale = std::ldexp(1.0f, static_cast<int>(block[0]) - 127);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t code = static_cast<uint8_t>((block[1 + i / 2] >> (i % 2 == 0 ? 0 : 4)) & 15);
      const float magnitude = kGrid[code & 7] * scale;
      sum[begin + i] += (code & 8) ? -magnitude : magnitude;
    }
  }
}

}  // namespace

std::string precision_name(OuterPrecision precision) {
  switch (precision) {
    case OuterPrecision::fp32:
      return "fp32";
    case OuterPrecision::bf16:
      return "bf16";
    case OuterPrecision::fp4:
      return "fp4";
  }
  return "?";
}

OuterPrecision parse_outer_precision(const std::string& name) {
  if (name == "fp32") return OuterPrecision::fp32;
  if (name == "bf16") return OuterPrecision::bf16;
  if (name == "fp4") return OuterPrecision::fp4;
  throw Error("diloco.exchange must be fp32, bf16 or fp4 (E2M1 with a scale per 32 values), not '" +
              name + "'");
}

int64_t encoded_bytes(OuterPrecision precision, int64_t count) {
  switch (precision) {
    case OuterPrecision::fp32:
      return 4 * count;
    case OuterPrecision::bf16:
      return 2 * count;
    case OuterPrecision::fp4:
      return (count + kFp4Block - 1) / kFp4Block * kFp4BlockBytes;
  }
  return 0;
}

void encode(OuterPrecision precision, const float* values, int64_t count, uint8_t* out) {
  switch (precision) {
    case OuterPrecision::fp32:
      std::memcpy(out, values, static_cast<size_t>(count) * sizeof(float));
      return;
    case OuterPrecision::bf16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = to_bf16(values[i]).bits;
        std::memcpy(out + 2 * i, &bits, 2);
      }
      return;
    case OuterPrecision::fp4:
      encode_fp4(values, count, out);
      return;
  }
}

void decode_add(OuterPrecision precision, const uint8_t* in, int64_t count, float* sum) {
  switch (precision) {
    case OuterPrecision::fp32:
      for (int64_t i = 0; i < count; ++i) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        sum[i] += v;
      }
      return;
    case OuterPrecision::bf16:
      for (int64_t i = 0; i < count; ++i) {
        bf16 v;
        std::memcpy(&v.bits, in + 2 * i, 2);
        sum[i] += to_float(v);
      }
      return;
    case OuterPrecision::fp4:
      decode_add_fp4(in, count, sum);
      return;
  }
}

}  // namespace lattice::replica
