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

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lattice/core/cpu_features.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/adamw_isa.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {
namespace {

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

// adamw_range of the best tier this CPU has (adamw_isa.hpp).
void adamw_range(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  static const auto chosen = cpu_features().avx512() ? avx512::adamw_range : portable_adamw_range;
  chosen(p, g, m, v, n, s);
}

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

// The portable tier: the same operations in scalar code, none contracted.
__attribute__((optimize("fp-contract=off"))) void portable_adamw_range(float* p, const float* g_in,
                                                                       float* m, float* v,
                                                                       int64_t n,
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
