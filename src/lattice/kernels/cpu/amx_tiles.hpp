// AMX tile state for the kernels that issue tile instructions themselves (attention, the packed
// row-chunk GEMM): whether this build targets AMX and Linux grants the process the tile state, and
// a scope that configures the calling thread's tile registers.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define LATTICE_HAS_AMX 1
#include <immintrin.h>

#include <cstdint>
#endif

namespace lattice::kernels {

// True when the build targets AMX (-march with amx-tile and amx-bf16) and Linux granted this
// process the tile state; asked once per process, the answer never changes.
bool amx_tile_state_granted();

#if defined(LATTICE_HAS_AMX)
// The calling thread's tile registers configured as eight 16 x 64-byte tiles while this lives
// (16 rows of 16 fp32 or 32 bf16), released after.
class AmxTileScope {
 public:
  AmxTileScope() {
    struct alignas(64) {
      uint8_t palette = 1, start_row = 0, reserved[14] = {};
      uint16_t colsb[16] = {};
      uint8_t rows[16] = {};
    } config;
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
  }
  ~AmxTileScope() { _tile_release(); }
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;
};

// A 32 x 32 fp32 block of C in tmm0-3 (tmm0 rows 0-15 x columns 0-15, tmm1 rows 0-15 x 16-31,
// tmm2 and tmm3 rows 16-31), for the kernels' 2 x 2 tile micro-GEMM. Strides are in bytes.
inline void amx_block_zero() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
inline void amx_block_load(const float* c, int64_t c_stride) {
  const float* lower =
      reinterpret_cast<const float*>(reinterpret_cast<const char*>(c) + 16 * c_stride);
  _tile_loadd(0, c, c_stride);
  _tile_loadd(1, c + 16, c_stride);
  _tile_loadd(2, lower, c_stride);
  _tile_loadd(3, lower + 16, c_stride);
}
inline void amx_block_store(float* c, int64_t c_stride) {
  float* lower = reinterpret_cast<float*>(reinterpret_cast<char*>(c) + 16 * c_stride);
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + 16, c_stride);
  _tile_stored(2, lower, c_stride);
  _tile_stored(3, lower + 16, c_stride);
}
// The block += A[32 rows, 32 k] · B[32 k, 32 columns] in bf16: A's rows at `a` (tmm4, tmm5), B's
// two 16-column halves in the pair layout [16][16][2] at b_left and b_right (tmm6, tmm7).
inline void amx_block_multiply(const void* a, int64_t a_stride, const void* b_left,
                               const void* b_right, int64_t b_stride) {
  _tile_loadd(4, a, a_stride);
  _tile_loadd(5, static_cast<const char*>(a) + 16 * a_stride, a_stride);
  _tile_loadd(6, b_left, b_stride);
  _tile_loadd(7, b_right, b_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
#endif

}  // namespace lattice::kernels
