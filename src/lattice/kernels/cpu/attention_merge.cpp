// attention_merge_partial: combines attention results over disjoint key blocks through their
// log-sum-exps (ring attention, chunked long sequences), as if one softmax had run over all keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"

namespace lattice::kernels {

void attention_merge_partial(float* out, float* lse, const float* part_out, const float* part_lse,
                             int64_t batch, int64_t q_len, int64_t q_heads, int64_t head_dim) {
  check(batch > 0 && q_len > 0 && q_heads > 0 && head_dim > 0,
        "attention_merge_partial: batch (" + std::to_string(batch) + "), q_len (" +
            std::to_string(q_len) + "), q_heads (" + std::to_string(q_heads) + ") and head_dim (" +
            std::to_string(head_dim) + ") must all be positive");
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t rows = batch * q_len * q_heads;  // one (batch, query, head) each
#pragma omp parallel for schedule(static) if (rows * head_dim >= (1 << 15))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t h = row % q_heads, t = (row / q_heads) % q_len, b = row / (q_heads * q_len);
    float& running_lse = lse[(b * q_heads + h) * q_len + t];
    const double a = running_lse, p = part_lse[(b * q_heads + h) * q_len + t];
    if (p == neg_inf) continue;  // the part saw no key: nothing changes
    float* o = out + row * head_dim;
    const float* po = part_out + row * head_dim;
    if (a == neg_inf) {  // nothing so far: the part as it is
      std::copy(po, po + head_dim, o);
      running_lse = static_cast<float>(p);
      continue;
    }
    const double m = std::max(a, p);
    const double wa = std::exp(a - m), wp = std::exp(p - m), sum = wa + wp;
    const double ca = wa / sum, cp = wp / sum;
    for (int64_t d = 0; d < head_dim; ++d)
      o[d] = static_cast<float>(ca * static_cast<double>(o[d]) + cp * static_cast<double>(po[d]));
    running_lse = static_cast<float>(m + std::log(sum));
  }
}

}  // namespace lattice::kernels
