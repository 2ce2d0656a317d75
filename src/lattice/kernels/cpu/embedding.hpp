// Token (and optional learned position) embedding lookup, forward and backward, over the whole
// vocabulary or a tensor-parallel rank's slice of it.
#pragma once

#include <cstdint>

#include "lattice/kernels/vocab_range.hpp"

namespace lattice::kernels {

// out[b,t,:] = wte[tokens[b,t],:] (+ wpe[pos_offset + t,:] when wpe is not null); with a `vocab`
// slice, wte holds rows [vocab.begin, vocab.end) and a token outside it gives a zero row (+ wpe).
// Token ids are trusted here (the data loader checks them).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t pos_offset = 0,
                       VocabRange vocab = {});

// d_wte[tokens[b,t],:] += d_out[b,t,:] for the tokens inside `vocab`; d_wpe[t,:] += sum over b
// (when d_wpe is not null). After a forward with pos_offset, pass d_wpe + pos_offset * C.
// Deterministic: each row is summed in token order (b, t), whatever the thread count.
void embedding_backward(float* d_wte, float* d_wpe, const float* d_out, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, VocabRange vocab = {});

}  // namespace lattice::kernels
