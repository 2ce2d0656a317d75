// Compute precision of the GEMM-class kernels: fp32 throughout, or bf16 inputs
// (round-to-nearest-even, AMX on this machine) with fp32 accumulation and fp32 outputs, as
// PyTorch's bf16 autocast does.
#pragma once

#include <string>
#include <string_view>

#include "lattice/core/error.hpp"

namespace lattice::kernels {

enum class Precision { fp32, bf16 };

inline Precision parse_precision(std::string_view name) {
  if (name == "fp32" || name == "float32") return Precision::fp32;
  if (name == "bf16" || name == "bfloat16") return Precision::bf16;
  throw Error("unknown precision '" + std::string(name) + "': use \"fp32\" or \"bf16\"");
}

inline std::string_view precision_name(Precision p) {
  return p == Precision::fp32 ? "fp32" : "bf16";
}

}  // namespace lattice::kernels
