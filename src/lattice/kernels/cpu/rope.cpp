// Rotary position embedding (Hugging Face Llama's rotate_half convention): the in-place rotation
// of strided [batch, seq, heads, head_dim] tensors by a RopeTable.
#include "lattice/kernels/cpu/rope.hpp"

#include <string>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

void rope_apply(const RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
                int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse) {
  const int64_t max_positions = table.max_positions(), head_dim = table.head_dim();
  check(pos_offset >= 0 && pos_offset + seq <= max_positions,
        "rope: positions " + std::to_string(pos_offset) + ".." + std::to_string(pos_offset + seq) +
            " exceed the table's max_positions " + std::to_string(max_positions) +
            "; build the RopeTable with a larger max_positions");
  check(row_stride >= heads * head_dim,
        "rope: row_stride " + std::to_string(row_stride) +
            " is smaller than heads * head_dim = " + std::to_string(heads * head_dim));
  const int64_t half = head_dim / 2;
  // Rotating by -angle (the inverse, and the adjoint since rotations are orthogonal) flips sin's
  // sign.
  const float sin_sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static) if (batch * seq * heads * head_dim > 65536)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* cos_row = table.cos() + (pos_offset + t) * half;
      const float* sin_row = table.sin() + (pos_offset + t) * half;
      float* row = x + b * batch_stride + t * row_stride;
      for (int64_t h = 0; h < heads; ++h) {
        float* first = row + h * head_dim;
        float* second = first + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos_row[i], s = sin_sign * sin_row[i];
          const float x1 = first[i], x2 = second[i];
          first[i] = x1 * c - x2 * s;
          second[i] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace lattice::kernels
