// A Linear's weight gradient on AMX: dW[N, K] (+)= D[M, N]^T · X[M, K] in bf16 with fp32
// accumulation, D the output gradient and X the input, both row-major over the M tokens (the
// reduction). oneDNN 2.6 reads D^T as a strided view and ran these products at 0.35–0.4 TFLOP/s
// per core in the training step; here a thread packs a block of tokens of both operands into the
// tile layouts while it is in cache (D transposed by 16 x 16 register transposes, X's token pairs
// interleaved) and sweeps it with the 2 x 2-tile micro-GEMM of amx_tiles.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// Whether the kernel takes a weight of [N, K] as stored, D being [M, N] dense: N and K positive
// multiples of 32 (any M >= 0). Any N > 0 is taken when D's rows are padded (below).
inline bool amx_weight_gradient_fits(int64_t N, int64_t K) {
  return N > 0 && K > 0 && N % 32 == 0 && K % 32 == 0;
}

// What the kernel does with dW:
//   overwrite:  dW = D^T · X
//   add:        dW += D^T · X, the sum over the tokens formed from zero and then added: the order
//               of oneDNN's GEMM with its sum post-op
//   accumulate: dW += D^T · X with dW's values the start of each sum (another rounding order, one
//               pass over dW fewer; for partial sums whose order is the caller's own)
enum class WeightGradientUpdate { overwrite, add, accumulate };

// Bytes of scratch (64-byte aligned) one thread needs for a [rows, columns] block of dW summed
// over at most M tokens.
size_t amx_weight_gradient_scratch_bytes(int64_t M, int64_t rows, int64_t columns,
                                         WeightGradientUpdate update);

// The block dW[rows, columns] (row stride ldw) (+)= D[M, rows]^T · X[M, columns] on the calling
// thread: D (row stride ldd) and X (row stride ldx) bf16, the block's columns of each. Every
// element is summed over the tokens in order, in steps of 32 (one tdpbf16ps each; a ragged last
// step padded with zeros), so that a caller splitting dW over threads gets the same bits for any
// split. columns must be a multiple of 32; rows need not be, but D's rows are then read up to rows
// rounded up to 32 (ldd must reach that; what the padding holds only reaches dW rows that are not
// written). The process must have the tile state (amx_tile_state_granted), and `scratch` hold
// amx_weight_gradient_scratch_bytes(M, rows, columns, update).
void amx_weight_gradient_block(float* dW, int64_t ldw, const lattice::bf16* D, int64_t ldd,
                               const lattice::bf16* X, int64_t ldx, int64_t M, int64_t rows,
                               int64_t columns, WeightGradientUpdate update, void* scratch);

}  // namespace lattice::kernels
