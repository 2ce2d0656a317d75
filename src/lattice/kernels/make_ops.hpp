// The kernel backend of a device, as the trainer, the commands and the tests make one: the only
// place that names a backend's class (kernels/cpu/cpu_ops.hpp).
#pragma once

#include <memory>

#include "lattice/core/device.hpp"
#include "lattice/kernels/ops.hpp"

namespace lattice::kernels {

// The backend for `device` with its documented environment settings (the CPU's:
// MatmulOptions::from_environment, docs/performance.md). Throws Error for a device this build has
// no backend for ("... no CUDA backend is built; ...").
std::unique_ptr<Ops> make_ops(Device device = Device::cpu);

}  // namespace lattice::kernels
