// CPU feature detection: see cpu_features.hpp. CPUID says what the processor implements, XCR0
// what the operating system saves on a context switch (a feature it does not save cannot be used),
// and Linux lends a process the AMX tile data (8 KiB of state per thread) only on request.
#include "lattice/core/cpu_features.hpp"

#include <cstdlib>
#include <string>

#include "lattice/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lattice {
namespace {

constexpr bool bit(unsigned long long word, int position) {
  return ((word >> position) & 1ull) != 0;
}

#if defined(__x86_64__) || defined(__i386__)
unsigned long long read_xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}
#endif

// Asks Linux for the AMX tile data (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); true when granted.
bool request_amx_tile_data() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kRequestXcompPermission = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kRequestXcompPermission, kXfeatureTileData) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return {};
  __cpuid(1, eax, ebx, ecx, edx);
  const unsigned leaf1_ecx = ecx;
  // XGETBV exists only where the OS enabled XSAVE (OSXSAVE, leaf 1 ecx bit 27).
  const unsigned long long xcr0 = bit(leaf1_ecx, 27) ? read_xcr0() : 0;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned leaf7_ebx = ebx, leaf7_edx = edx, leaf7_max_subleaf = eax;
  unsigned leaf7_1_eax = 0;
  if (leaf7_max_subleaf >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    leaf7_1_eax = eax;
  }
  const CpuFeatures unasked =
      decode_cpu_features(leaf1_ecx, leaf7_ebx, leaf7_edx, leaf7_1_eax, xcr0, true);
  // Only a CPU and OS with the tile state are asked for it.
  const bool granted = unasked.amx_tile && request_amx_tile_data();
  return decode_cpu_features(leaf1_ecx, leaf7_ebx, leaf7_edx, leaf7_1_eax, xcr0, granted);
#else
  return {};
#endif
}

}  // namespace

CpuFeatures decode_cpu_features(unsigned leaf1_ecx, unsigned leaf7_ebx, unsigned leaf7_edx,
                                unsigned leaf7_1_eax, unsigned long long xcr0, bool amx_granted) {
  CpuFeatures f;
  // XCR0: bit 1 SSE, bit 2 AVX (upper ymm); bits 5-7 the opmask, the upper zmm halves and
  // zmm16-31; bits 17-18 the tile configuration and the tile data.
  const bool os_ymm = bit(xcr0, 1) && bit(xcr0, 2);
  const bool os_zmm = os_ymm && bit(xcr0, 5) && bit(xcr0, 6) && bit(xcr0, 7);
  const bool os_tiles = bit(xcr0, 17) && bit(xcr0, 18);
  // Leaf 1 ecx: FMA 12, AVX 28, F16C 29.
  const bool avx = os_ymm && bit(leaf1_ecx, 28);
  f.fma = avx && bit(leaf1_ecx, 12);
  f.f16c = avx && bit(leaf1_ecx, 29);
  // Leaf 7 ebx: AVX2 5, AVX512F 16, AVX512DQ 17, AVX512CD 28, AVX512BW 30, AVX512VL 31.
  f.avx2 = avx && bit(leaf7_ebx, 5);
  f.avx512f = os_zmm && bit(leaf7_ebx, 16);
  f.avx512dq = f.avx512f && bit(leaf7_ebx, 17);
  f.avx512cd = f.avx512f && bit(leaf7_ebx, 28);
  f.avx512bw = f.avx512f && bit(leaf7_ebx, 30);
  f.avx512vl = f.avx512f && bit(leaf7_ebx, 31);
  // Leaf 7 subleaf 1 eax: AVX512_BF16 5.
  f.avx512_bf16 = f.avx512f && bit(leaf7_1_eax, 5);
  // Leaf 7 edx: AMX-BF16 22, AMX-TILE 24.
  f.amx_tile = os_tiles && bit(leaf7_edx, 24);
  f.amx_bf16 = f.amx_tile && bit(leaf7_edx, 22);
  f.amx_tile_data_granted = f.amx_tile && amx_granted;
  return f;
}

std::string CpuFeatures::best_tier() const {
  if (amx()) return "AMX-BF16";
  if (avx512_with_bf16()) return "AVX512-BF16";
  if (avx512()) return "AVX-512";
  if (avx2 && fma) return "AVX2";
  return "baseline x86-64";
}

CpuFeatures capped_cpu_features(CpuFeatures f, std::string_view max_tier) {
  if (max_tier.empty() || max_tier == "amx") return f;
  if (max_tier != "avx512_bf16" && max_tier != "avx512" && max_tier != "avx2")
    throw Error("LATTICE_MAX_CPU_ISA=" + std::string(max_tier) +
                " is not a choice: use amx, avx512_bf16, avx512 or avx2, or unset it");
  f.amx_tile = f.amx_bf16 = f.amx_tile_data_granted = false;
  if (max_tier == "avx512_bf16") return f;
  f.avx512_bf16 = false;
  if (max_tier == "avx512") return f;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = false;
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    const char* cap = std::getenv("LATTICE_MAX_CPU_ISA");
    return capped_cpu_features(detect(), cap != nullptr ? cap : "");
  }();
  return features;
}

}  // namespace lattice
