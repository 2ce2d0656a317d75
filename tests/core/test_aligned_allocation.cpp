// Tests of aligned_allocation: 64-byte alignment for small blocks and AlignedVector, 2 MiB
// alignment with the huge-page advice recorded by Linux (the "hg" VmFlag of the block's mapping)
// for large ones, the whole block writable, freed mapped blocks reused, and nullptr (no crash) when
// the request cannot be met.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "lattice/core/aligned_allocation.hpp"

namespace lattice {
namespace {

// The VmFlags line of the /proc/self/smaps mapping that contains `address` ("" if none found).
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > 8) {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(AlignedAllocation, SmallBlocksAreCacheLineAligned) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{4097}, size_t{1} << 20}) {
    void* block = allocate_aligned(bytes);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u) << bytes;
    std::memset(block, 0x5a, bytes);
    free_aligned(block);
  }
}

TEST(AlignedAllocation, LargeBlocksAreHugePageAlignedAndAdvised) {
  const size_t bytes = kHugePageThresholdBytes * 3 + 4096 + 8;  // a ragged last huge page
  auto* block = static_cast<unsigned char*>(allocate_aligned(bytes));
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % kHugePageThresholdBytes, 0u);
  std::memset(block, 0x5a, bytes);
  EXPECT_EQ(block[0], 0x5a);
  EXPECT_EQ(block[bytes - 1], 0x5a);
  // Linux marks a range advised MADV_HUGEPAGE with "hg", whether or not it had huge pages to give.
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    const std::string flags = vm_flags_of(block);
    ASSERT_FALSE(flags.empty()) << "no /proc/self/smaps entry for the block";
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  }
  free_aligned(block);
}

long minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A block of `bytes` freed and asked for again is the same mapping; a second one is another.
void expect_reused(size_t bytes) {
  auto* first = static_cast<unsigned char*>(allocate_aligned(bytes));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % kHugePageThresholdBytes, 0u);
  std::memset(first, 0x33, bytes);
  free_aligned(first);
  malloc_trim(0);  // what glibc does to its heap's free pages when they pile up during a step
  auto* second = static_cast<unsigned char*>(allocate_aligned(bytes));
  EXPECT_EQ(second, first);  // the cached mapping, not a fresh one
  // Its pages stayed mapped: writing all of it again faults none in (glibc's heap hands the
  // same address back below 32 MiB too, but once trimmed with pages the kernel must zero first).
  const long faults_before = minor_page_faults();
  std::memset(second, 0x55, bytes);
  EXPECT_EQ(minor_page_faults() - faults_before, 0);
  std::memset(second, 0x33, bytes);
  auto* other = static_cast<unsigned char*>(allocate_aligned(bytes));  // the first is taken
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other, second);
  std::memset(other, 0x44, bytes);
  EXPECT_EQ(second[bytes - 1], 0x33);  // distinct blocks
  free_aligned(second);
  free_aligned(other);
}

TEST(AlignedAllocation, FreedLargeBlocksAreReusedForTheSameSize) {
  // Above glibc's 32 MiB mmap threshold, and below it (3 MiB: glibc's heap would trim and refault).
  for (const size_t bytes : {(size_t{40} << 20) + 100, (size_t{3} << 20) + 100}) {
    SCOPED_TRACE(bytes);
    expect_reused(bytes);
  }
}

TEST(AlignedAllocation, AlignedVectorStartsOnACacheLineAndKeepsItsValues) {
  // Sizes around glibc's 16-byte-aligned large blocks (whose AMX tile stores straddle lines).
  for (const size_t n : {size_t{1}, size_t{17}, size_t{1} << 18, (size_t{1} << 20) + 3}) {
    SCOPED_TRACE(n);
    AlignedVector<float> v(n, 1.5f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
    v.push_back(2.5f);  // regrown: the new block is aligned too, the values carried over
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
    EXPECT_EQ(v.front(), 1.5f);
    EXPECT_EQ(v[n - 1], 1.5f);
    EXPECT_EQ(v.back(), 2.5f);
  }
  AlignedVector<double> empty;
  empty.reserve(0);
  EXPECT_TRUE(empty.empty());
  EXPECT_THROW(AlignedVector<double>(std::numeric_limits<size_t>::max() / 16), std::bad_alloc);
}

TEST(AlignedAllocation, ImpossibleRequestReturnsNull) {
  EXPECT_EQ(allocate_aligned(std::numeric_limits<size_t>::max() / 2), nullptr);
  free_aligned(nullptr);  // a no-op, as std::free
}

}  // namespace
}  // namespace lattice
