// MatmulOptions::from_environment: the documented matmul settings of the command line
// (docs/training.md), the one place in the kernels that reads the environment; engines take the
// options their caller passes (matmul.hpp).
#include <cstdlib>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/matmul.hpp"

namespace lattice::kernels {

MatmulOptions MatmulOptions::from_environment() {
  MatmulOptions options;
  const char* fallback = std::getenv("LATTICE_MATMUL_BF16_FALLBACK");
  if (fallback != nullptr && *fallback != '\0') {
    const std::string name = fallback;
    if (name == "onednn")
      options.bf16_fallback = Bf16FallbackGemm::onednn_bf16;
    else if (name == "fp32")
      options.bf16_fallback = Bf16FallbackGemm::widened_fp32;
    else
      throw Error("LATTICE_MATMUL_BF16_FALLBACK=" + name +
                  " is not a choice: use onednn (oneDNN's bf16 matmul) or fp32 (the bf16 operands "
                  "widened to fp32, sgemm), or unset it");
  }
  const char* no_amx = std::getenv("LATTICE_MATMUL_NO_AMX_PACKED");
  options.amx_kernels = no_amx == nullptr || *no_amx == '\0' || *no_amx == '0';
  return options;
}

}  // namespace lattice::kernels
