// Vocabulary-parallel cross-entropy (Megatron's): each tensor-parallel rank holds the logits of
// its slice of the vocabulary, [rows, V_local] with columns [0, valid) real and the rest padding
// (never counted), and no rank holds a whole row. The loss needs each row's maximum, sum of
// exponentials and target logit over every slice: the caller reduces them across the
// tensor-parallel group between the three calls (max, then sum, then sum).
#pragma once

#include <cstdint>

#include "lattice/kernels/vocab_range.hpp"

namespace lattice::kernels {

// row_max[r] = the maximum of row r's real logits (-inf for a slice with none).
void vocab_slice_row_max(float* row_max, const float* logits, int64_t rows, int64_t V_local,
                         int64_t valid);

// Given the group's row_max: row_sum[r] = the sum of e^(x - row_max[r]) over this slice's real
// columns, and target_logit[r] = the target's logit where this slice holds the target
// (vocab.contains(targets[r])), else 0.
void vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                          const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t V_local, int64_t valid, VocabRange vocab);

// Given the group's row_max, row_sum and target_logit (the sums over the slices): returns the
// summed loss of the rows whose target is not negative, log(row_sum) + row_max - target_logit, in
// double in row order; when d_logits is not null writes the gradient of grad_scale x that sum,
// (e^(x - row_max) / row_sum - onehot) x grad_scale, over the real columns and 0 over the padding
// and on ignored rows (d_logits may alias logits).
double vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                        const float* row_sum, const float* target_logit, const int32_t* targets,
                        int64_t rows, int64_t V_local, int64_t valid, VocabRange vocab,
                        float grad_scale);

}  // namespace lattice::kernels
