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
#endif

}  // namespace lattice::kernels
