// AMX tile state: see amx_tiles.hpp.
#include "lattice/kernels/cpu/amx_tiles.hpp"

#if defined(LATTICE_HAS_AMX) && !defined(LATTICE_AMX_EMULATED)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lattice::kernels {

bool amx_tile_state_granted() {
#if defined(LATTICE_AMX_EMULATED)
  return true;  // the tiles are plain memory
#elif defined(LATTICE_HAS_AMX)
  // Linux grants a process the AMX tile state only on request (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA).
  static const bool granted = [] {
    constexpr long kRequestXcompPermission = 0x1023, kXfeatureTileData = 18;
    return syscall(SYS_arch_prctl, kRequestXcompPermission, kXfeatureTileData) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

}  // namespace lattice::kernels
