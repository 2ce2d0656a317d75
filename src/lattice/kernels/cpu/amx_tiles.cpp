// AMX tile state: see amx_tiles.hpp. Compiled for any CPU (the AMX kernels' own files are compiled
// for AMX and run only where this says so).
#include "lattice/kernels/cpu/amx_tiles.hpp"

#include "lattice/core/cpu_features.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"

namespace lattice::kernels {

bool amx_tile_state_granted() {
#if defined(LATTICE_AMX_EMULATED)
  return true;  // the tiles are plain memory
#else
  // CPUID's AMX-TILE and AMX-BF16, XCR0's tile state and Linux's grant of the tile data
  // (cpu_features.hpp), asked once per process.
  return cpu_features().amx();
#endif
}

bool amx_packed_gemm_enabled() {
  return amx_tile_state_granted();
}

}  // namespace lattice::kernels
