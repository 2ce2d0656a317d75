// The backend factory: see make_ops.hpp.
#include "lattice/kernels/make_ops.hpp"

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"

namespace lattice::kernels {

std::unique_ptr<Ops> make_ops(Device device) {
  if (device != Device::cpu) throw Error(no_backend_message(device, "kernel backend"));
  return std::make_unique<CpuOps>(MatmulOptions::from_environment());
}

}  // namespace lattice::kernels
