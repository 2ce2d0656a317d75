// The x86-64 instruction sets this CPU and its operating system let the kernels use, read once per
// process from CPUID, XCR0 and (for AMX) Linux's permission request. The kernels' AVX-512 and AMX
// code is compiled apart from the portable code (the *_avx512.cpp, *_avx512bf16.cpp and *_amx.cpp
// files, CMakeLists.txt) and chosen from this at run time, so that a binary built on one x86-64
// host runs on any other: kernels/cpu and comm's reduce kernels read it, nothing else decides.
#pragma once

#include <string>
#include <string_view>

namespace lattice {

struct CpuFeatures {
  // AVX2 with FMA and F16C (x86-64-v3's vector part), the portable build's baseline.
  bool avx2 = false, fma = false, f16c = false;
  // AVX-512 foundation and the extensions the kernels use, each only where the OS also saves the
  // zmm and mask registers (XCR0 bits 5-7).
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_bf16 = false;
  // AMX tiles and their bf16 dot product where XCR0 enables the tile state (bits 17-18) and Linux
  // granted this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM).
  bool amx_tile = false, amx_bf16 = false, amx_tile_data_granted = false;

  // The kernels' AVX-512 tier: F, BW, VL, DQ and CD (what -march=skylake-avx512 and later have).
  bool avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && avx512cd; }
  // The tier with AVX512-BF16 conversions and dot products (Cooper Lake, Sapphire Rapids, Zen 4).
  bool avx512_with_bf16() const { return avx512() && avx512_bf16; }
  // Lattice's AMX kernels: tiles, their bf16 product and the tile state granted, beside the
  // AVX512-BF16 tier they also use.
  bool amx() const { return amx_tile && amx_bf16 && amx_tile_data_granted && avx512_with_bf16(); }
  // The best tier, e.g. "AMX-BF16", "AVX512-BF16", "AVX-512", "AVX2", "baseline x86-64".
  std::string best_tier() const;
};

// This machine's features, detected on first use and then fixed for the process. The setting
// LATTICE_MAX_CPU_ISA = avx2 | avx512 | avx512_bf16 | amx caps them at that tier, as oneDNN's
// ONEDNN_MAX_CPU_ISA caps oneDNN's (to run a lower tier's code on a higher host: with both at
// AVX2 an AMX host takes the paths of an AVX2-only one); a value that is no choice throws Error.
const CpuFeatures& cpu_features();

// `features` without the tiers above `max_tier` (LATTICE_MAX_CPU_ISA's values; empty: all).
CpuFeatures capped_cpu_features(CpuFeatures features, std::string_view max_tier);

// The features described by CPUID leaf 1 (ecx), leaf 7 subleaf 0 (ebx, edx) and subleaf 1 (eax)
// and the XCR0 state mask: the decoding cpu_features() applies, exposed for tests of its bit
// positions. `amx_granted` stands for the answer to the AMX permission request.
CpuFeatures decode_cpu_features(unsigned leaf1_ecx, unsigned leaf7_ebx, unsigned leaf7_edx,
                                unsigned leaf7_1_eax, unsigned long long xcr0, bool amx_granted);

}  // namespace lattice
