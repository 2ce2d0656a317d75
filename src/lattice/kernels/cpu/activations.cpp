// GELU (tanh form) and SwiGLU forward and backward: see activations.hpp. Written through sigmoids,
// which are exact rewrites without cancellation: 0.5 * (1 + tanh(u)) = sigmoid(2u) and
// 1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)); exp comes from fast_exp so the loops vectorise.
#include "lattice/kernels/cpu/activations.hpp"

#include <algorithm>

#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"

namespace lattice::kernels {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi), PyTorch's kBeta
constexpr float kGeluCubic = 0.044715f;              // PyTorch's kKappa
constexpr int64_t kParallelThreshold = 32768;        // below this, threads cost more than they save

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

#if defined(__AVX512F__)
// gelu_value_and_slope on 16 lanes, the same operations in the same order (bit for bit), both
// results rounded to bf16 in registers.
inline void gelu_value_and_slope_bf16(lattice::bf16* value, lattice::bf16* slope, __m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f), sqrt2_over_pi = _mm512_set1_ps(kSqrt2OverPi);
  const __m512 x_squared = _mm512_mul_ps(x, x);
  const __m512 u = _mm512_mul_ps(
      sqrt2_over_pi,
      _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluCubic), x_squared), x)));
  const __m512 du_dx = _mm512_mul_ps(
      sqrt2_over_pi,
      _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(3.0f * kGeluCubic), x_squared)));
  const __m512 e = fast_exp(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
  const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
  const __m512 one_minus_s = _mm512_mul_ps(e, s);
  const __m512 two_x_s = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), x), s);
  const __m512 slope_value =
      _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(two_x_s, one_minus_s), du_dx));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(value), to_bf16_bits(_mm512_mul_ps(x, s)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(slope), to_bf16_bits(slope_value));
}
#endif

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
#if defined(__AVX512F__)
  // Rounded in registers; the tail as below.
  const int64_t vector_end = n / 16 * 16;
  for (int64_t i = 0; i < vector_end; i += 16)
    gelu_value_and_slope_bf16(out + i, slope + i, _mm512_loadu_ps(in + i));
  out += vector_end, slope += vector_end, in += vector_end, n -= vector_end;
#endif
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
    int64_t vector_end = 0;
#if defined(__AVX512F__)
    // 16 columns at a time in registers: the product rounded, its column sums accumulated in the
    // same order (row by row, in double) as the loop below.
    vector_end = cols / 16 * 16;
    for (int64_t j = 0; j < vector_end; j += 16) {
      const int64_t e = i * cols + j;
      // (Zero-masked forms with every lane selected: GCC 12 warns, falsely, on the unmasked
      // forms' undefined pass-through operand.)
      const __m512i slope_bits = _mm512_maskz_cvtepu16_epi32(
          0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slope + e)));
      const __m512 product =
          _mm512_mul_ps(_mm512_loadu_ps(d_out + e),
                        _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, slope_bits, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d_in16 + e), to_bf16_bits(product));
      if (column_sums != nullptr) {
        double* sum = column_sums + j;
        const __m256 low = _mm512_maskz_extractf32x8_ps(0xff, product, 0);
        const __m256 high = _mm512_maskz_extractf32x8_ps(0xff, product, 1);
        _mm512_storeu_pd(sum,
                         _mm512_add_pd(_mm512_loadu_pd(sum), _mm512_maskz_cvtps_pd(0xff, low)));
        _mm512_storeu_pd(
            sum + 8, _mm512_add_pd(_mm512_loadu_pd(sum + 8), _mm512_maskz_cvtps_pd(0xff, high)));
      }
    }
#endif
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
