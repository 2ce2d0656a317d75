// GELU (tanh form) and SwiGLU forward and backward: see activations.hpp. Written through sigmoids,
// which are exact rewrites without cancellation: 0.5 * (1 + tanh(u)) = sigmoid(2u) and
// 1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)); exp comes from fast_exp so the loops vectorise.
#include "lattice/kernels/cpu/activations.hpp"

#include <algorithm>

#include "lattice/core/cpu_features.hpp"
#include "lattice/kernels/cpu/activations_isa.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"

namespace lattice::kernels {

namespace {

constexpr int64_t kParallelThreshold = 32768;  // below this, threads cost more than they save

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x * (1 / (1 + e^(-2u))), u = sqrt(2/pi) (x + 0.044715
// x^3): one division, the sigmoid's, which gelu_value_and_slope shares with the slope. The fp32
// GELU; gelu_value_and_slope computes the same bits (u in the same order as gelu_grad's).
inline float gelu_value(float x) {
  const float x_squared = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x_squared * x);
  return x * (1.0f / (1.0f + fast_exp(-2.0f * u)));
}

// d/dx [x s] * dy with s = sigmoid(2u): s + x (1 - tanh^2(u)) / 2 * du/dx = s + 2 x s (1 - s)
// du/dx. The fp32 GELU backward; gelu_value_and_slope's slope is the same bits for dy = 1.
inline float gelu_grad(float x, float dy) {
  const float x_squared = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x_squared * x);
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x_squared);
  const float e = fast_exp(-2.0f * u);
  const float s = 1.0f / (1.0f + e);  // sigmoid(2u) = 0.5 (1 + tanh(u))
  const float one_minus_s = e * s;    // 1 - sigmoid(2u), without cancellation
  return dy * (s + 2.0f * x * s * one_minus_s * du_dx);
}

// gelu_value(x) and gelu_grad(x, 1) from one exponential, each bit for bit as computed alone.
inline void gelu_value_and_slope(float x, float& value, float& slope) {
  const float x_squared = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x_squared * x);
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x_squared);
  const float e = fast_exp(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  value = x * s;
  const float one_minus_s = e * s;
  slope = s + 2.0f * x * s * one_minus_s * du_dx;
}

// Elements per block of the bf16 forward: the fp32 values of a block stay in L1 before rounding.
constexpr int64_t kBf16Block = 1024;

// The portable tier: no vectors, the callers' loops take every element.
int64_t no_gelu_forward_vectors(lattice::bf16*, lattice::bf16*, const float*, int64_t) {
  return 0;
}
int64_t no_gelu_backward_vectors(lattice::bf16*, double*, const float*, const lattice::bf16*,
                                 int64_t) {
  return 0;
}

// The best tier's vector loops on this CPU (chosen once).
const ActivationVectors& activation_vectors() {
  static const ActivationVectors& chosen = []() -> const ActivationVectors& {
    static constexpr ActivationVectors kPortable{no_gelu_forward_vectors, no_gelu_backward_vectors};
    const CpuFeatures& cpu = cpu_features();
    if (cpu.avx512_with_bf16()) return avx512bf16::activation_vectors();
    if (cpu.avx512()) return avx512::activation_vectors();
    return kPortable;
  }();
  return chosen;
}

}  // namespace

void gelu_forward(float* out, const float* in, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_value(in[i]);
}

void gelu_backward(float* d_in, const float* d_out, const float* in, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) d_in[i] = gelu_grad(in[i], d_out[i]);
}

void gelu_forward_bf16_with_slope_on_this_thread(lattice::bf16* out, lattice::bf16* slope,
                                                 const float* in, int64_t n) {
  // The best tier's vectors first (activations_isa.hpp), rounded in registers; the rest here.
  const int64_t vector_end = activation_vectors().gelu_forward_bf16_with_slope(out, slope, in, n);
  out += vector_end, slope += vector_end, in += vector_end, n -= vector_end;
  alignas(64) float values[kBf16Block];
  alignas(64) float slopes[kBf16Block];
  for (int64_t begin = 0; begin < n; begin += kBf16Block) {
    const int64_t count = std::min(kBf16Block, n - begin);
    const float* x = in + begin;
#pragma omp simd simdlen(16)
    for (int64_t i = 0; i < count; ++i) gelu_value_and_slope(x[i], values[i], slopes[i]);
    convert_to_bf16_on_this_thread(out + begin, values, count);
    convert_to_bf16_on_this_thread(slope + begin, slopes, count);
  }
}

void gelu_forward_bf16_with_slope(lattice::bf16* out, lattice::bf16* slope, const float* in,
                                  int64_t n) {
  const int64_t blocks = (n + kBf16Block - 1) / kBf16Block;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBf16Block;
    gelu_forward_bf16_with_slope_on_this_thread(out + begin, slope + begin, in + begin,
                                                std::min(kBf16Block, n - begin));
  }
}

void gelu_backward_from_slope_bf16_rows(lattice::bf16* d_in16, double* column_sums,
                                        const float* d_out, const lattice::bf16* slope,
                                        int64_t rows, int64_t cols) {
  alignas(64) float values[kBf16Block];
  for (int64_t i = 0; i < rows; ++i) {
    // The best tier's vectors first (activations_isa.hpp), then the rest of the row here.
    const int64_t vector_end = activation_vectors().gelu_backward_from_slope_bf16_row(
        d_in16 + i * cols, column_sums, d_out + i * cols, slope + i * cols, cols);
    for (int64_t begin = vector_end; begin < cols; begin += kBf16Block) {
      const int64_t width = std::min(kBf16Block, cols - begin);
      const lattice::bf16* g = slope + i * cols + begin;
      const float* dy = d_out + i * cols + begin;
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < width; ++j) values[j] = dy[j] * lattice::to_float(g[j]);
      convert_to_bf16_on_this_thread(d_in16 + i * cols + begin, values, width);
      if (column_sums != nullptr) {
        double* sum = column_sums + begin;
#pragma omp simd simdlen(8)
        for (int64_t j = 0; j < width; ++j) sum[j] += static_cast<double>(values[j]);
      }
    }
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + fast_exp(-g)) * up[i];
  }
}

void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float u = up[i];
    const float dy = d_out[i];
    const float e = fast_exp(-g);
    const float s = 1.0f / (1.0f + e);  // sigmoid(g)
    const float one_minus_s = e * s;
    // silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)), as PyTorch's silu_backward.
    d_gate[i] = dy * u * (s * (1.0f + g * one_minus_s));
    d_up[i] = dy * (g * s);
  }
}

}  // namespace lattice::kernels
