// The row-chunk GEMM on AMX with its B operand (a Linear's weight) packed once per call into the
// tile layout: C[M, N] = A[M, K] · B[K, N] in bf16 with fp32 accumulation on the calling thread.
// oneDNN 2.6's single-thread brgemm re-lays B out on every chunk call (a whole [N, K] weight for a
// 256-row chunk); with B packed once, the same tile products run about twice as fast on the
// chunk shapes of the LM head and the MLP stand-alone, and a few percent of the training step
// faster in it, where memory traffic bounds them (docs/performance.md).
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// True when this process can run the packed GEMM (amx_tile_state_granted). Whether an engine uses
// it is the engine's option (MatmulOptions::amx_kernels). Defined in amx_tiles.cpp, which runs on
// any CPU (this kernel's file is compiled for AMX: CMakeLists.txt).
bool amx_packed_gemm_enabled();

// Whether a B of [K, N] fits the kernel's tiles without padding: K and N multiples of 32.
inline bool amx_packed_gemm_fits(int64_t K, int64_t N) {
  return K > 0 && N > 0 && K % 32 == 0 && N % 32 == 0;
}

// n rounded up to a multiple of 32: the kernel's padded K and N.
inline int64_t amx_padded(int64_t n) {
  return (n + 31) / 32 * 32;
}

// B packed into 32-column panels: panel p holds columns [32p, 32p + 32) as [Kp/2][32][2] (the bf16
// pairs (k, k + 1) of each column side by side, as tdpbf16ps reads B), Kp and Np being K and N
// rounded up to 32 (amx_padded) and the padding zero. `weight` is a Linear's bf16 weight, [N, K]
// row-major when `weight_transposed` (B = weight^T: the forward), else [K, N] row-major (B =
// weight: the input gradient). `packed` holds Kp * Np elements. Multi-threaded: call it outside
// parallel regions.
void pack_b_panels(uint16_t* packed, const lattice::bf16* weight, bool weight_transposed, int64_t K,
                   int64_t N);

// C[M, Np] (row stride ldc >= Np, overwritten) = A[M, Kp] (bf16, row stride lda >= Kp) · B
// (packed by pack_b_panels for K and N) on the calling thread, any M >= 0. Where K or N is not a
// multiple of 32, A's columns [K, Kp) are read (they must hold finite values: they meet B's zero
// rows) and C's columns [N, Np) receive zeros (A times B's zero columns). Every element is
// accumulated over K in steps of 32 in order, each step one tdpbf16ps, as oneDNN's brgemm does: on
// the shapes tested the results equal oneDNN's bit for bit.
void amx_packed_gemm(float* C, int64_t ldc, const lattice::bf16* A, int64_t lda,
                     const uint16_t* packed, int64_t M, int64_t N, int64_t K);

}  // namespace lattice::kernels
