// The packed AMX row-chunk GEMM: see amx_packed_gemm.hpp. Blocks of 32 x 32 outputs live in four
// accumulator tiles while K is swept in steps of 32 (two A tiles, two B tiles, four tdpbf16ps per
// step); K is cut in blocks (block_k) so that a block's 32-column panel of B stays in L1 while
// every 32-row block of A passes over it, the accumulators going through C (fp32, exact: the sums
// are the same bits as without blocks) between blocks.
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

namespace lattice::kernels {

namespace {

#if defined(LATTICE_HAS_AMX)

// K per block: 256 (a 16 KiB panel of B, in L1 beside the A tiles) for narrow outputs; for wide
// ones the C round trips per block cost more than the panel's L1 misses, so 1024. Measured in the
// small benchmark's training step (N = 256: input gradients with K = 768 and 1024, mlp_proj's
// forward): 256 +2.1% over 1024 (4 pairs), 128 no better than 256, 512 no better than 1024; the
// GPT-2 124M step (N >= 768) was 0.8% slower with 256.
int64_t block_k(int64_t N) {
  return N <= 256 ? 256 : 1024;
}

// Panel of columns [n0, n0 + 32) of B = weight^T, weight [N, K], over Kp = K rounded up to 32
// rows: word (kp, j) of the panel is word kp of weight row n0 + j (zero past row N or column K),
// so the panel is the [32 x Kp/2] word block transposed, 16 x 16 at a time.
void pack_transposed_panel(uint16_t* panel, const lattice::bf16* weight, int64_t K, int64_t N,
                           int64_t n0) {
  const int64_t words = amx_padded(K) / 2;
  for (int64_t j0 = 0; j0 < 32; j0 += 16) {
    for (int64_t w0 = 0; w0 < words; w0 += 16) {
      u32x16 r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = u32x16{};
        const int64_t row = n0 + j0 + i, k0 = 2 * w0;
        if (row < N && k0 + 32 <= K)
          std::memcpy(&r[i], weight + row * K + k0, sizeof r[i]);  // a fixed size: one load
        else if (row < N && k0 < K)
          std::memcpy(&r[i], weight + row * K + k0, static_cast<size_t>(K - k0) * 2);
      }
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i) std::memcpy(panel + ((w0 + i) * 32 + j0) * 2, &r[i], 64);
    }
  }
}

// Panel of columns [n0, n0 + 32) of B = weight [K, N], over Kp = K rounded up to 32 rows: row kp
// of the panel interleaves rows 2kp and 2kp + 1 of the weight (zero past row K or column N).
void pack_plain_panel(uint16_t* panel, const lattice::bf16* weight, int64_t K, int64_t N,
                      int64_t n0) {
  const auto row16 = [&](int64_t k, int64_t column) {
    u16x16 v{};
    if (k < K && column + 16 <= N)
      std::memcpy(&v, weight + k * N + column, sizeof v);  // a fixed size: one vector load
    else if (k < K && column < N)
      std::memcpy(&v, weight + k * N + column, static_cast<size_t>(N - column) * 2);
    return v;
  };
  for (int64_t kp = 0; kp < amx_padded(K) / 2; ++kp) {
    for (int64_t j0 = 0; j0 < 32; j0 += 16) {
      const u16x16 a = row16(2 * kp, n0 + j0), b = row16(2 * kp + 1, n0 + j0);
      const u16x32 mixed = interleave_pairs(a, b);
      std::memcpy(panel + (kp * 32 + j0) * 2, &mixed, sizeof mixed);
    }
  }
}

// C[rows, N] for rows a multiple of 32, tiles configured by the caller.
void gemm_row_blocks(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* packed,
                     int64_t rows, int64_t N, int64_t K) {
  const int64_t c_stride = ldc * 4, a_stride = lda * 2;
  const int64_t k_step = block_k(N);
  for (int64_t k_begin = 0; k_begin < K; k_begin += k_step) {
    const int64_t k_end = std::min(K, k_begin + k_step);
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const uint16_t* panel = packed + n0 * K;  // [K/2][32][2]: a k-pair row is 64 elements
      for (int64_t m0 = 0; m0 < rows; m0 += 32) {
        float* c = C + m0 * ldc + n0;
        if (k_begin == 0)
          amx_block_zero();
        else
          amx_block_load(c, c_stride);
        const uint16_t* a = A + m0 * lda;
        // The next block's 32 rows of C (after a panel's last row block, the next panel's first)
        // taken for writing a few rows a k step, so that its tile stores find their lines owned
        // rather than each waiting on memory: C is written once, and in the training step its
        // lines are rarely in cache (a chunk's C is 256 rows of up to 4 KiB).
        const int64_t next_m0 = m0 + 32 < rows ? m0 + 32 : 0;
        const int64_t next_n0 = m0 + 32 < rows ? n0 : n0 + 32;
        const char* next_c = reinterpret_cast<const char*>(C + next_m0 * ldc + next_n0);
        const int64_t steps = (k_end - k_begin) / 32;
        const int64_t rows_per_step = next_n0 < N ? (32 + steps - 1) / steps : 0;
        int64_t next_row = 0;
        for (int64_t k0 = k_begin; k0 < k_end; k0 += 32) {
          for (int64_t r = 0; r < rows_per_step && next_row < 32; ++r, ++next_row) {
            __builtin_prefetch(next_c + next_row * c_stride, 1);
            __builtin_prefetch(next_c + next_row * c_stride + 64, 1);
          }
          amx_block_multiply(a + k0, a_stride, panel + k0 * 32, panel + k0 * 32 + 32, 128);
        }
        amx_block_store(c, c_stride);
      }
    }
  }
}
#endif

}  // namespace

void pack_b_panels(uint16_t* packed, const lattice::bf16* weight, bool weight_transposed, int64_t K,
                   int64_t N) {
  check(K > 0 && N > 0, "pack_b_panels: K and N must be positive, got K=" + std::to_string(K) +
                            " N=" + std::to_string(N));
#if defined(LATTICE_HAS_AMX)
  const int64_t Kp = amx_padded(K);
#pragma omp parallel for schedule(static)
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    if (weight_transposed)
      pack_transposed_panel(packed + n0 * Kp, weight, K, N, n0);
    else
      pack_plain_panel(packed + n0 * Kp, weight, K, N, n0);
  }
#else
  (void)packed, (void)weight, (void)weight_transposed;
  throw Error("pack_b_panels: this build does not target AMX");
#endif
}

void amx_packed_gemm(float* C, int64_t ldc, const lattice::bf16* A, int64_t lda,
                     const uint16_t* packed, int64_t M, int64_t N, int64_t K) {
  check(K > 0 && N > 0 && M >= 0 && lda >= amx_padded(K) && ldc >= amx_padded(N),
        "amx_packed_gemm: needs K and N positive, M >= 0, lda and ldc at least K and N rounded up "
        "to 32");
#if defined(LATTICE_HAS_AMX)
  if (M == 0) return;
  check(amx_tile_state_granted(),
        "amx_packed_gemm: the process has no AMX tile state (check amx_packed_gemm_enabled first)");
  const AmxTileScope tiles;
  const auto* a = reinterpret_cast<const uint16_t*>(A);
  const int64_t Kp = amx_padded(K), Np = amx_padded(N);
  const int64_t full = M / 32 * 32;
  if (full > 0) gemm_row_blocks(C, ldc, a, lda, packed, full, Np, Kp);
  if (full == M) return;
  // The last M % 32 rows through a zero-padded 32-row block.
  const int64_t tail = M - full;
  std::vector<uint16_t> a_block(static_cast<size_t>(32 * Kp), 0);
  std::vector<float> c_block(static_cast<size_t>(32 * Np));
  for (int64_t r = 0; r < tail; ++r)
    std::memcpy(a_block.data() + r * Kp, a + (full + r) * lda, static_cast<size_t>(Kp) * 2);
  gemm_row_blocks(c_block.data(), Np, a_block.data(), Kp, packed, 32, Np, Kp);
  for (int64_t r = 0; r < tail; ++r)
    std::memcpy(C + (full + r) * ldc, c_block.data() + r * Np, static_cast<size_t>(Np) * 4);
#else
  (void)C, (void)A, (void)packed;
  throw Error("amx_packed_gemm: this build does not target AMX");
#endif
}

}  // namespace lattice::kernels
