// Pointwise activations: GELU in its tanh form (GPT-2, PyTorch approximate="tanh") and SwiGLU
// (Llama: silu(gate) * up), forward and backward.
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

void gelu_forward(float* out, const float* in, int64_t n);
void gelu_backward(float* d_in, const float* d_out, const float* in,
                   int64_t n);  // d_in overwritten
// bf16 training keeps GELU's slope instead of its fp32 input: the forward writes
//   out[i]   = bf16(gelu(in[i]))          (bit for bit lattice::to_bf16 of gelu_forward's)
//   slope[i] = bf16(d gelu / dx at in[i])  (gelu_backward's factor of d_out, rounded)
// and the backward is d_in = d_out * slope, with no transcendental and half the bytes of the
// fp32 input to read back (as PyTorch's bf16 autocast, which keeps the bf16 input). The slope's
// rounding (relative 2^-9) is the same size as d_in's own rounding to bf16.
void gelu_forward_bf16_with_slope(lattice::bf16* out, lattice::bf16* slope, const float* in,
                                  int64_t n);
void gelu_forward_bf16_with_slope_on_this_thread(lattice::bf16* out, lattice::bf16* slope,
                                                 const float* in, int64_t n);
// The backward from the kept slope over rows [0, rows) of [rows, cols] on the calling thread, for
// a caller that produces d_out a chunk of rows at a time (MatmulEngine::multiply_in_row_chunks):
// d_in16 = bf16(d_out * slope) (overwritten), the next Linear's bf16 d_out; when column_sums is not
// null, column_sums[j] += the fp32 products of column j, row by row in double (the chunk's share of
// that Linear's bias gradient).
void gelu_backward_from_slope_bf16_rows(lattice::bf16* d_in16, double* column_sums,
                                        const float* d_out, const lattice::bf16* slope,
                                        int64_t rows, int64_t cols);

// out = silu(gate) * up, silu(x) = x * sigmoid(x).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// d_gate and d_up overwritten.
void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t n);

}  // namespace lattice::kernels
