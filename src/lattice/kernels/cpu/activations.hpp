// Pointwise activations: GELU in its tanh form (GPT-2, PyTorch approximate="tanh") and SwiGLU
// (Llama: silu(gate) * up), forward and backward.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

void gelu_forward(float* out, const float* in, int64_t n);
// gelu_forward with its output rounded to bf16 (bit for bit lattice::to_bf16 of gelu_forward's),
// for a bf16 GEMM that reads it: no fp32 output is written or read back.
void gelu_forward_bf16(lattice::bf16* out, const float* in, int64_t n);
// gelu_forward_bf16 on the calling thread only (a chunk of a larger batch).
void gelu_forward_bf16_on_this_thread(lattice::bf16* out, const float* in, int64_t n);
void gelu_backward(float* d_in, const float* d_out, const float* in,
                   int64_t n);  // d_in overwritten
// gelu_backward over rows [0, rows) of [rows, cols] on the calling thread, for a caller that
// produces d_out a chunk of rows at a time (MatmulEngine::multiply_in_row_chunks): d_in16 is
// gelu_backward's d_in rounded to bf16 (bit for bit lattice::to_bf16 of it; overwritten), for the
// next Linear's bf16 backward; when column_sums is not null, column_sums[j] += the fp32 d_in's
// column j summed row by row in double (the chunk's share of that Linear's bias gradient).
void gelu_backward_bf16_rows(lattice::bf16* d_in16, double* column_sums, const float* d_out,
                             const float* in, int64_t rows, int64_t cols);

// out = silu(gate) * up, silu(x) = x * sigmoid(x).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// d_gate and d_up overwritten.
void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t n);

}  // namespace lattice::kernels
