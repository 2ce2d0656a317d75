// AdamW's inner update of each instruction-set tier, private to kernels/cpu: adamw.cpp's portable
// loop and adamw_avx512.cpp's (chosen where cpu_features() has AVX-512), each torch's operation
// order with no operation fused; adamw.cpp threads them and rounds the bf16 copies.
#pragma once

#include <cstdint>

namespace lattice::kernels {

// The fp32 scalars of one update, each rounded once from its double value (adamw.cpp).
struct AdamWScalars {
  float grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt,
      eps, neg_step_size;
};

// p, m, v [n] updated from g [n] (adamw.hpp's arithmetic).
void portable_adamw_range(float* p, const float* g, float* m, float* v, int64_t n,
                          const AdamWScalars& s);
namespace avx512 {
void adamw_range(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);
}

}  // namespace lattice::kernels
