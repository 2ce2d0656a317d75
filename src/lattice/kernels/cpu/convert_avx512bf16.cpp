// convert_avx512.cpp's converters compiled for AVX512-BF16 (CMakeLists.txt), as the avx512bf16
// tier of convert_isa.hpp.
#define LATTICE_CONVERT_TIER avx512bf16
#include "convert_avx512.cpp"  // NOLINT(bugprone-suspicious-include): the same kernels, another ISA
