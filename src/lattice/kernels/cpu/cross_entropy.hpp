// Fused softmax + cross-entropy over the vocabulary, with the logits' gradient written in place.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// loss_r = logsumexp(logits[r,:]) - logits[r, targets[r]]; rows whose target is negative are
// ignored (loss 0, gradient 0). Returns the sum of the row losses (accumulated in double).
double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows, int64_t V);

// As above, and writes d_logits[r,:] = (softmax(logits[r,:]) - onehot(targets[r])) * grad_scale.
// d_logits may alias logits (in place).
double cross_entropy_forward_backward(float* d_logits, const float* logits, const int32_t* targets,
                                      int64_t rows, int64_t V, float grad_scale);

// As cross_entropy_forward_backward, with the gradient written rounded to bf16 (bit for bit
// lattice::to_bf16 of the fp32 gradient above), ready for the head's bf16 backward GEMMs: saves
// writing the fp32 gradient and reading it back to round it; `logits` is only read.
double cross_entropy_forward_backward_bf16(lattice::bf16* d_logits, const float* logits,
                                           const int32_t* targets, int64_t rows, int64_t V,
                                           float grad_scale);

}  // namespace lattice::kernels
