// The serial fp32 <-> bf16 converters of each instruction-set tier, private to kernels/cpu:
// convert.cpp (portable, element by element) and convert_avx512.cpp (16 lanes at a time), the
// latter compiled twice, for AVX-512 and again for AVX512-BF16 (convert_avx512bf16.cpp:
// vcvtneps2bf16). Every tier is bit-identical to lattice::to_bf16 / to_float; convert.cpp calls
// the best one cpu_features() allows (serial_converters).
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

struct SerialConverters {
  void (*to_bf16)(bf16* out, const float* in, int64_t n);
  // out[i] = to_bf16(in[i] * scale): the fp32 product, then rounded.
  void (*to_bf16_scaled)(bf16* out, const float* in, int64_t n, float scale);
  void (*to_f32)(float* out, const bf16* in, int64_t n);
};

// Each tier's converters; the AVX-512 ones may be called only where cpu_features() has the tier.
const SerialConverters& portable_converters();
namespace avx512 {
const SerialConverters& converters();
}
namespace avx512bf16 {
const SerialConverters& converters();
}

// The best tier's converters on this CPU (chosen once).
const SerialConverters& serial_converters();

}  // namespace lattice::kernels
