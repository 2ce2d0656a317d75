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

// Rows [0, rows) of cross_entropy_forward_backward_bf16 (or, with d_logits null, of
// cross_entropy_forward) on the calling thread, for callers that produce the logits a chunk at a
// time (the LM head, see MatmulEngine::multiply_in_row_chunks): row_losses[r] receives row r's loss
// (0 for an ignored row), bit for bit what the whole-batch functions compute for it. `work` is a
// scratch row of V floats. Targets must already be checked to lie below V. Rows of `logits` and
// `d_logits` are `row_stride` (>= V) apart.
void cross_entropy_rows_bf16(lattice::bf16* d_logits, double* row_losses, const float* logits,
                             const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                             float* work, int64_t row_stride);

}  // namespace lattice::kernels
