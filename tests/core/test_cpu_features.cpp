// Tests of CPU feature detection: the decoding of CPUID and XCR0 bits (each feature needs its CPUID
// bit and the OS state that saves its registers), and that the detected features agree with the
// compiler's own view of this CPU (__builtin_cpu_supports, which reads CPUID but not XCR0 or the
// AMX permission).
#include <gtest/gtest.h>

#include <cstdlib>

#include "lattice/core/cpu_features.hpp"
#include "lattice/core/error.hpp"

namespace lattice {
namespace {

// CPUID and XCR0 of a CPU with everything the kernels use (Sapphire Rapids).
constexpr unsigned kLeaf1Ecx = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29);
constexpr unsigned kLeaf7Ebx =
    (1u << 5) | (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
constexpr unsigned kLeaf7Edx = (1u << 22) | (1u << 24);
constexpr unsigned kLeaf71Eax = 1u << 5;
constexpr unsigned long long kXcr0 = 0x60000ull | 0xe0ull | 0x6ull;

TEST(CpuFeatures, EverythingDecodesToTheAmxTier) {
  const CpuFeatures f =
      decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, kLeaf7Edx, kLeaf71Eax, kXcr0, true);
  EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  EXPECT_TRUE(f.avx512());
  EXPECT_TRUE(f.avx512_with_bf16());
  EXPECT_TRUE(f.amx());
  EXPECT_EQ(f.best_tier(), "AMX-BF16");
}

TEST(CpuFeatures, EachTierNeedsItsCpuidBitsAndItsOsState) {
  // No tile data granted by Linux: AVX512-BF16 is the best tier.
  EXPECT_EQ(
      decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, kLeaf7Edx, kLeaf71Eax, kXcr0, false).best_tier(),
      "AVX512-BF16");
  // XCR0 without the tile state (bits 17-18): no AMX even where CPUID has it and Linux would grant.
  EXPECT_FALSE(
      decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, kLeaf7Edx, kLeaf71Eax, kXcr0 & ~0x60000ull, true)
          .amx());
  // No AVX512_BF16 (Ice Lake): plain AVX-512.
  EXPECT_EQ(decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, 0, 0, kXcr0, false).best_tier(), "AVX-512");
  // AVX512BW missing (Knights Landing): not the kernels' AVX-512 tier.
  EXPECT_EQ(decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx & ~(1u << 30), 0, 0, kXcr0, false).best_tier(),
            "AVX2");
  // An OS that does not save the zmm state (XCR0 bits 5-7) hides every AVX-512 feature.
  const CpuFeatures no_zmm =
      decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, kLeaf7Edx, kLeaf71Eax, kXcr0 & ~0xe0ull, true);
  EXPECT_FALSE(no_zmm.avx512f);
  EXPECT_FALSE(no_zmm.avx512_bf16);
  EXPECT_EQ(no_zmm.best_tier(), "AVX2");
  // AMD Zen 3: AVX2 and FMA, no AVX-512 bits.
  EXPECT_EQ(decode_cpu_features(kLeaf1Ecx, 1u << 5, 0, 0, 0x7ull, false).best_tier(), "AVX2");
  // An OS without the ymm state: not even AVX2.
  EXPECT_EQ(decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, 0, 0, 0x3ull, false).best_tier(),
            "baseline x86-64");
}

TEST(CpuFeatures, TheCapRemovesTheTiersAboveIt) {
  const CpuFeatures all =
      decode_cpu_features(kLeaf1Ecx, kLeaf7Ebx, kLeaf7Edx, kLeaf71Eax, kXcr0, true);
  EXPECT_EQ(capped_cpu_features(all, "").best_tier(), "AMX-BF16");
  EXPECT_EQ(capped_cpu_features(all, "amx").best_tier(), "AMX-BF16");
  EXPECT_EQ(capped_cpu_features(all, "avx512_bf16").best_tier(), "AVX512-BF16");
  EXPECT_EQ(capped_cpu_features(all, "avx512").best_tier(), "AVX-512");
  const CpuFeatures avx2 = capped_cpu_features(all, "avx2");
  EXPECT_EQ(avx2.best_tier(), "AVX2");
  EXPECT_FALSE(avx2.avx512f || avx2.avx512_bf16 || avx2.amx_tile);
  // A cap never adds a tier the CPU lacks.
  const CpuFeatures zen3 = decode_cpu_features(kLeaf1Ecx, 1u << 5, 0, 0, 0x7ull, false);
  EXPECT_EQ(capped_cpu_features(zen3, "amx").best_tier(), "AVX2");
  EXPECT_THROW(capped_cpu_features(all, "sse2"), Error);
}

TEST(CpuFeatures, DetectionAgreesWithTheCompilersCpuidView) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(&f, &cpu_features());  // detected once
#if defined(__x86_64__)
  // XCR0 can only take features away from what CPUID reports.
  EXPECT_LE(f.avx2, __builtin_cpu_supports("avx2") != 0);
  EXPECT_LE(f.fma, __builtin_cpu_supports("fma") != 0);
  EXPECT_LE(f.avx512f, __builtin_cpu_supports("avx512f") != 0);
  EXPECT_LE(f.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  EXPECT_LE(f.avx512vl, __builtin_cpu_supports("avx512vl") != 0);
  // On Linux the OS saves every state it has, so where CPUID has a vector ISA, so do we (unless
  // LATTICE_MAX_CPU_ISA caps it).
  if (std::getenv("LATTICE_MAX_CPU_ISA") == nullptr) {
    EXPECT_EQ(f.avx2, __builtin_cpu_supports("avx2") != 0);
    EXPECT_EQ(f.avx512f, __builtin_cpu_supports("avx512f") != 0);
    EXPECT_EQ(f.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  }
#endif
  if (f.amx()) {
    EXPECT_TRUE(f.avx512_with_bf16());
  }
  EXPECT_FALSE(f.best_tier().empty());
}

}  // namespace
}  // namespace lattice
