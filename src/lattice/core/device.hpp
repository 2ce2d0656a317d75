// Device: where a tensor's storage lives, and its name for messages.
#pragma once

#include <cstdint>
#include <string_view>

namespace lattice {

// cpu: host memory, the CPU backend's (kernels/cpu). cuda: a CUDA backend's device memory; this
// build has no CUDA backend, so storage there is refused at run time (core/device_memory.hpp).
enum class Device : uint8_t { cpu, cuda };
std::string_view device_name(Device device);

}  // namespace lattice
