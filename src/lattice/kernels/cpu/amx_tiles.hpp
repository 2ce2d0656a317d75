// AMX tile state for the kernels that issue tile instructions themselves (attention, the packed
// row-chunk GEMM): whether this CPU has AMX and Linux grants the process the tile state, and a
// scope that configures the calling thread's tile registers (defined in files compiled for AMX:
// LATTICE_HAS_AMX). With LATTICE_AMX_EMULATED (a test
// build for hosts without AMX, tests/CMakeLists.txt) the same kernels run on a scalar emulation of
// the tile instructions below: their packing, blocking and tails are tested there, not the tile
// unit or its speed.
#pragma once

#if defined(LATTICE_AMX_EMULATED) || (defined(__AMX_TILE__) && defined(__AMX_BF16__))
#define LATTICE_HAS_AMX 1
#include <immintrin.h>

#include <cstdint>
#endif
#if defined(LATTICE_AMX_EMULATED)
#include <cstring>
#endif

namespace lattice::kernels {

// True where this CPU has AMX-TILE and AMX-BF16 and Linux granted this process the tile state
// (cpu_features().amx(); always with LATTICE_AMX_EMULATED); asked once per process, the answer
// never changes. The kernels' files are compiled for AMX whatever the rest of the build targets
// (CMakeLists.txt); their tile code runs only where this is true.
bool amx_tile_state_granted();

#if defined(LATTICE_AMX_EMULATED)
// Eight 16 x 64-byte tiles per thread, and the four instructions the kernels issue, in plain C++.
namespace amx_emulation {
struct alignas(64) Tile {
  unsigned char bytes[16][64];
};
inline Tile* tiles() {
  thread_local Tile file[8];
  return file;
}
inline void load(int t, const void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r)
    std::memcpy(tiles()[t].bytes[r], static_cast<const char*>(base) + r * stride, 64);
}
inline void store(int t, void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, tiles()[t].bytes[r], 64);
}
inline void zero(int t) {
  std::memset(tiles()[t].bytes, 0, sizeof(Tile));
}
inline float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}
// tdpbf16ps: C[m][n] += A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1] over the 16 pairs k, in fp32
// (C 16 x 16 fp32, A 16 x 32 bf16, B 16 pair rows x 16 columns x 2 bf16).
inline void dpbf16ps(int c, int a, int b) {
  float acc[16][16];
  std::memcpy(acc, tiles()[c].bytes, sizeof acc);
  uint16_t lhs[16][32], rhs[16][32];
  std::memcpy(lhs, tiles()[a].bytes, sizeof lhs);
  std::memcpy(rhs, tiles()[b].bytes, sizeof rhs);
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) {
      const float a0 = bf16_value(lhs[m][2 * k]), a1 = bf16_value(lhs[m][2 * k + 1]);
      for (int n = 0; n < 16; ++n)
        acc[m][n] += a0 * bf16_value(rhs[k][2 * n]) + a1 * bf16_value(rhs[k][2 * n + 1]);
    }
  std::memcpy(tiles()[c].bytes, acc, sizeof acc);
}
}  // namespace amx_emulation
#define LATTICE_TILE_LOAD(t, base, stride) amx_emulation::load(t, base, stride)
#define LATTICE_TILE_STORE(t, base, stride) amx_emulation::store(t, base, stride)
#define LATTICE_TILE_ZERO(t) amx_emulation::zero(t)
#define LATTICE_TILE_DPBF16PS(c, a, b) amx_emulation::dpbf16ps(c, a, b)
#elif defined(LATTICE_HAS_AMX)
#define LATTICE_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define LATTICE_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define LATTICE_TILE_ZERO(t) _tile_zero(t)
#define LATTICE_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

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
#if !defined(LATTICE_AMX_EMULATED)
    // Not _tile_loadconfig: GCC 12's declares its operand as the 8 bytes of a pointer, so the
    // compiler may drop the stores to the rest of the configuration as dead. It did in an
    // experimental change to the vocabulary-blocked head (colsb stayed zero and ldtilecfg
    // faulted). Here the operand is the whole 64-byte configuration.
    asm volatile("ldtilecfg %0" : : "m"(config));
#endif
  }
#if defined(LATTICE_AMX_EMULATED)
  ~AmxTileScope() = default;
#else
  ~AmxTileScope() {
    _tile_release();
  }
#endif
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;
};

// A 32 x 32 fp32 block of C in tmm0-3 (tmm0 rows 0-15 x columns 0-15, tmm1 rows 0-15 x 16-31,
// tmm2 and tmm3 rows 16-31), for the kernels' 2 x 2 tile micro-GEMM. Strides are in bytes.
inline void amx_block_zero() {
  LATTICE_TILE_ZERO(0);
  LATTICE_TILE_ZERO(1);
  LATTICE_TILE_ZERO(2);
  LATTICE_TILE_ZERO(3);
}
inline void amx_block_load(const float* c, int64_t c_stride) {
  const float* lower =
      reinterpret_cast<const float*>(reinterpret_cast<const char*>(c) + 16 * c_stride);
  LATTICE_TILE_LOAD(0, c, c_stride);
  LATTICE_TILE_LOAD(1, c + 16, c_stride);
  LATTICE_TILE_LOAD(2, lower, c_stride);
  LATTICE_TILE_LOAD(3, lower + 16, c_stride);
}
inline void amx_block_store(float* c, int64_t c_stride) {
  float* lower = reinterpret_cast<float*>(reinterpret_cast<char*>(c) + 16 * c_stride);
  LATTICE_TILE_STORE(0, c, c_stride);
  LATTICE_TILE_STORE(1, c + 16, c_stride);
  LATTICE_TILE_STORE(2, lower, c_stride);
  LATTICE_TILE_STORE(3, lower + 16, c_stride);
}
// The block += A[32 rows, 32 k] · B[32 k, 32 columns] in bf16: A's rows at `a` (tmm4, tmm5), B's
// two 16-column halves in the pair layout [16][16][2] at b_left and b_right (tmm6, tmm7).
inline void amx_block_multiply(const void* a, int64_t a_stride, const void* b_left,
                               const void* b_right, int64_t b_stride) {
  LATTICE_TILE_LOAD(4, a, a_stride);
  LATTICE_TILE_LOAD(5, static_cast<const char*>(a) + 16 * a_stride, a_stride);
  LATTICE_TILE_LOAD(6, b_left, b_stride);
  LATTICE_TILE_LOAD(7, b_right, b_stride);
  LATTICE_TILE_DPBF16PS(0, 4, 6);
  LATTICE_TILE_DPBF16PS(1, 4, 7);
  LATTICE_TILE_DPBF16PS(2, 5, 6);
  LATTICE_TILE_DPBF16PS(3, 5, 7);
}
#endif

}  // namespace lattice::kernels
