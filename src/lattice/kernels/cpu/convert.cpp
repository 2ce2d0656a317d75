// fp32 <-> bf16 bulk conversion: see convert.hpp. The serial converters come from the best
// instruction-set tier this CPU has (convert_isa.hpp: AVX-512 rounds 16 lanes at a time with
// bf16_vector.hpp's to_bf16_bits, vcvtneps2bf16 on AVX512-BF16; the portable tier element by
// element with lattice::to_bf16); this file threads them over chunks.
#include "lattice/kernels/cpu/convert.hpp"

#include <algorithm>
#include <cstdint>

#include "lattice/core/cpu_features.hpp"
#include "lattice/kernels/cpu/convert_isa.hpp"

namespace lattice::kernels {
namespace {

// Elements per parallel work item: large enough to amortise scheduling, small enough to split work.
constexpr int64_t kChunk = 1 << 16;

void portable_to_bf16(bf16* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void portable_to_bf16_scaled(bf16* out, const float* in, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i] * scale);
}

void portable_to_f32(float* out, const bf16* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

void to_bf16_serial(bf16* out, const float* in, int64_t n) {
  serial_converters().to_bf16(out, in, n);
}

void to_f32_serial(float* out, const bf16* in, int64_t n) {
  serial_converters().to_f32(out, in, n);
}

}  // namespace

const SerialConverters& portable_converters() {
  static constexpr SerialConverters kConverters{portable_to_bf16, portable_to_bf16_scaled,
                                                portable_to_f32};
  return kConverters;
}

const SerialConverters& serial_converters() {
  static const SerialConverters& chosen = []() -> const SerialConverters& {
    const CpuFeatures& cpu = cpu_features();
    if (cpu.avx512_with_bf16()) return avx512bf16::converters();
    if (cpu.avx512()) return avx512::converters();
    return portable_converters();
  }();
  return chosen;
}

void convert_to_bf16(bf16* out, const float* in, int64_t n) {
  if (n <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    to_bf16_serial(out + begin, in + begin, std::min(kChunk, n - begin));
  }
}

void convert_to_bf16_on_this_thread(bf16* out, const float* in, int64_t n) {
  if (n > 0) to_bf16_serial(out, in, n);
}

void convert_scaled_to_bf16_on_this_thread(bf16* out, const float* in, float scale, int64_t n) {
  if (n > 0) serial_converters().to_bf16_scaled(out, in, n, scale);
}

void convert_to_f32(float* out, const bf16* in, int64_t n) {
  if (n <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    to_f32_serial(out + begin, in + begin, std::min(kChunk, n - begin));
  }
}

void convert_to_f32_on_this_thread(float* out, const bf16* in, int64_t n) {
  if (n > 0) to_f32_serial(out, in, n);
}

void convert_rows_to_bf16(bf16* out, const float* in, int64_t rows, int64_t cols,
                          int64_t in_row_stride) {
  if (rows <= 0 || cols <= 0) return;
  if (in_row_stride == cols) return convert_to_bf16(out, in, rows * cols);
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
  for (int64_t r = 0; r < rows; ++r) to_bf16_serial(out + r * cols, in + r * in_row_stride, cols);
}

}  // namespace lattice::kernels
