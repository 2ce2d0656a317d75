// AdamW: see adamw.hpp. Reproduces torch 1.13 _single_tensor_adamw operation by operation:
//   g = grad * grad_scale                          (clip_grad_norm_'s grad.mul_(coef), fp32)
//   p = p * float(1 - lr*wd)                       (param.mul_; factor computed in double)
//   m = fma(g, float(1-b1), m * float(b1))         (exp_avg.mul_(b1).add_(g, alpha=1-b1): ATen's
//                                                   vectorised add-with-alpha is one fmadd)
//   v = v * float(b2) + (float(1-b2) * g) * g      (exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2))
//   d = sqrt(v) / float(sqrt(1 - b2^step)) + float(eps)
//   p = p + (float(-lr / (1 - b1^step)) * m) / d   (param.addcdiv_(m, d, value=-step_size))
// where the bias corrections are Python-double arithmetic (pow in double), each scalar rounded to
// fp32 once when handed to the fp32 kernel. Every fp32 operation is written out explicitly
// (intrinsics GCC cannot fuse, masked tails) so the compiler cannot contract or reorder it.
#include "lattice/kernels/cpu/adamw.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {
namespace {

struct AdamWScalars {
  float grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt,
      eps, neg_step_size;
};

AdamWScalars make_scalars(const AdamWHyper& h, int64_t step, float grad_scale) {
  const double step_d = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, step_d);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, step_d);
  const double step_size = h.lr / bias_correction1;
  AdamWScalars s;
  s.grad_scale = grad_scale;
  s.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(h.eps);
  s.neg_step_size = static_cast<float>(-step_size);
  return s;
}

// Elements per parallel work item.
constexpr int64_t kChunk = 1 << 14;
// Elements updated before they are rounded into the bf16 copy: 4 KiB of values, still in L1.
constexpr int64_t kRoundBlock = 1024;

#if defined(__AVX512F__)
// The *_round_ps forms (round to nearest, exceptions suppressed as in plain arithmetic) are used
// because GCC treats plain _mm512_mul_ps / _mm512_add_ps as ordinary vector arithmetic and
// contracts a multiply feeding an add into an FMA; these builtins are never fused. Their
// zero-masked forms with every lane selected: GCC 12 warns (falsely) on the unmasked forms'
// undefined pass-through operand.
constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr __mmask16 kAllLanes = 0xffff;
inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_maskz_mul_round_ps(kAllLanes, a, b, kNearest);
}
inline __m512 add(__m512 a, __m512 b) {
  return _mm512_maskz_add_round_ps(kAllLanes, a, b, kNearest);
}
inline __m512 div(__m512 a, __m512 b) {
  return _mm512_maskz_div_round_ps(kAllLanes, a, b, kNearest);
}

inline void adamw_vector(float* p, const float* g_in, float* m, float* v, __mmask16 mask,
                         const AdamWScalars& s) {
  const __m512 g = mul(_mm512_maskz_loadu_ps(mask, g_in), _mm512_set1_ps(s.grad_scale));
  __m512 pv = mul(_mm512_maskz_loadu_ps(mask, p), _mm512_set1_ps(s.decay));
  __m512 mv = mul(_mm512_maskz_loadu_ps(mask, m), _mm512_set1_ps(s.beta1));
  mv = _mm512_fmadd_ps(g, _mm512_set1_ps(s.one_minus_beta1), mv);
  __m512 vv = mul(_mm512_maskz_loadu_ps(mask, v), _mm512_set1_ps(s.beta2));
  vv = add(vv, mul(mul(_mm512_set1_ps(s.one_minus_beta2), g), g));
  __m512 denom = div(_mm512_maskz_sqrt_round_ps(kAllLanes, vv, kNearest),
                     _mm512_set1_ps(s.bias_correction2_sqrt));
  denom = add(denom, _mm512_set1_ps(s.eps));
  pv = add(pv, div(mul(_mm512_set1_ps(s.neg_step_size), mv), denom));
  _mm512_mask_storeu_ps(p, mask, pv);
  _mm512_mask_storeu_ps(m, mask, mv);
  _mm512_mask_storeu_ps(v, mask, vv);
}

void adamw_range(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) adamw_vector(p + i, g + i, m + i, v + i, 0xffff, s);
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    adamw_vector(p + i, g + i, m + i, v + i, tail, s);
  }
}
#else
__attribute__((optimize("fp-contract=off"))) void adamw_range(float* p, const float* g_in, float* m,
                                                              float* v, int64_t n,
                                                              const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = g_in[i] * s.grad_scale;
    float pv = p[i] * s.decay;
    const float mv = std::fma(g, s.one_minus_beta1, m[i] * s.beta1);
    const float scaled = s.one_minus_beta2 * g;
    const float vv = v[i] * s.beta2 + scaled * g;
    const float denom = std::sqrt(vv) / s.bias_correction2_sqrt + s.eps;
    const float update = s.neg_step_size * mv;
    pv = pv + update / denom;
    p[i] = pv;
    m[i] = mv;
    v[i] = vv;
  }
}
#endif

// Elements [begin, end) of one tensor (at most one chunk), rounded into param16 when given.
void adamw_chunk(float* param, const float* grad, float* m, float* v, lattice::bf16* param16,
                 int64_t begin, int64_t end, const AdamWScalars& scalars) {
  if (param16 == nullptr) {
    adamw_range(param + begin, grad + begin, m + begin, v + begin, end - begin, scalars);
    return;
  }
  for (int64_t b = begin; b < end; b += kRoundBlock) {
    const int64_t count = std::min(kRoundBlock, end - b);
    adamw_range(param + b, grad + b, m + b, v + b, count, scalars);
    convert_to_bf16_on_this_thread(param16 + b, param + b, count);
  }
}

void check_step(int64_t step) {
  if (step < 1)  // the message is built only on failure: this runs per parameter every step
    throw Error("adamw_update: step must be 1-based (got " + std::to_string(step) +
                "); pass the number of updates including this one");
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int64_t step, float grad_scale, lattice::bf16* param16) {
  check_step(step);
  if (n <= 0) return;
  const AdamWScalars scalars = make_scalars(hyper, step, grad_scale);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    adamw_chunk(param, grad, m, v, param16, begin, std::min(n, begin + kChunk), scalars);
  }
}

void adamw_update_tensors(std::span<const AdamWTensor> tensors, int64_t step, float grad_scale) {
  check_step(step);
  // Work items: each tensor's chunks, as adamw_update cuts them.
  const RunChunks chunks(tensors, kChunk);
  std::vector<AdamWScalars> scalars;
  scalars.reserve(tensors.size());
  for (const AdamWTensor& t : tensors) scalars.push_back(make_scalars(t.hyper, step, grad_scale));
#pragma omp parallel for schedule(static) if (chunks.count() > 1)
  for (int64_t item = 0; item < chunks.count(); ++item) {
    const RunChunks::Item c = chunks.at(item);
    const AdamWTensor& t = tensors[c.run];
    adamw_chunk(t.param, t.grad, t.m, t.v, t.param16, c.begin, c.end, scalars[c.run]);
  }
}

}  // namespace lattice::kernels
