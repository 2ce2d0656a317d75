// AdamW's AVX-512 inner update (adamw_isa.hpp), compiled with the AVX-512 flags (CMakeLists.txt):
// 16 lanes at a time, the tail masked, every operation one that GCC cannot fuse or reorder.
#include <immintrin.h>

#include "lattice/kernels/cpu/adamw_isa.hpp"

namespace lattice::kernels::avx512 {
namespace {

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

}  // namespace

void adamw_range(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) adamw_vector(p + i, g + i, m + i, v + i, 0xffff, s);
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    adamw_vector(p + i, g + i, m + i, v + i, tail, s);
  }
}

}  // namespace lattice::kernels::avx512
