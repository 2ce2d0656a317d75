// activations_avx512.cpp's loops compiled for AVX512-BF16 (CMakeLists.txt), as the avx512bf16
// tier of activations_isa.hpp.
#define LATTICE_ACTIVATIONS_TIER avx512bf16
#include "activations_avx512.cpp"  // NOLINT(bugprone-suspicious-include): the same loops, another ISA
