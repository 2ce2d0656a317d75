// Fused softmax + cross-entropy over the vocabulary, with the logits' gradient written in place.
#pragma once

#include <cstdint>

namespace lattice::kernels {

// loss_r = logsumexp(logits[r,:]) - logits[r, targets[r]]; rows whose target is negative are ignored
// (loss 0, gradient 0). Returns the sum of the row losses (accumulated in double).
double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows, int64_t V);

// As above, and writes d_logits[r,:] = (softmax(logits[r,:]) - onehot(targets[r])) * grad_scale.
// d_logits may alias logits (in place).
double cross_entropy_forward_backward(float* d_logits, const float* logits, const int32_t* targets,
                                      int64_t rows, int64_t V, float grad_scale);

}  // namespace lattice::kernels
