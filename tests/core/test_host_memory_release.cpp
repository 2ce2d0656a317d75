// HostMemory::release and copy_rows: a released range reads back as zeros, its neighbours are
// untouched, and the whole pages inside it leave the resident set (what makes ZeRO-2/3's memory
// drop real, not only tracked); row copies move each run between its pitches and nothing else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "lattice/core/device_memory.hpp"
#include "lattice/core/memory.hpp"

namespace {

void release_floats(float* data, size_t count) {
  lattice::host_memory().release(data, count * sizeof(float));
}

}  // namespace

TEST(HostMemoryRelease, RangeBecomesZeroAndNeighboursStay) {
  std::vector<float> data(100000, 1.5f);
  release_floats(data.data() + 777, 50000);
  for (size_t i = 0; i < data.size(); ++i) {
    const bool inside = i >= 777 && i < 777 + 50000;
    ASSERT_EQ(data[i], inside ? 0.0f : 1.5f) << i;
  }
  release_floats(data.data() + 3, 5);  // less than a page
  EXPECT_EQ(data[2], 1.5f);
  EXPECT_EQ(data[3], 0.0f);
  EXPECT_EQ(data[7], 0.0f);
  EXPECT_EQ(data[8], 1.5f);
  release_floats(data.data() + 9, 0);  // nothing
  EXPECT_EQ(data[9], 1.5f);
}

TEST(HostMemoryRelease, ResidentSetDrops) {
  const size_t count = size_t{64} << 20 >> 2;  // 64 MiB of floats
  auto* data = static_cast<float*>(std::aligned_alloc(64, count * sizeof(float)));
  ASSERT_NE(data, nullptr);
  for (size_t i = 0; i < count; ++i) data[i] = 1.0f;  // commit every page
  const int64_t before = lattice::process_rss_bytes();
  if (before == 0) GTEST_SKIP() << "no /proc RSS on this system";
  release_floats(data, count);
  const int64_t after = lattice::process_rss_bytes();
  EXPECT_LT(after, before - (int64_t{48} << 20)) << before << " -> " << after;
  EXPECT_EQ(data[count / 2], 0.0f);
  std::free(data);
}

TEST(HostMemoryCopyRows, EachRunMovesBetweenItsPitchesAndNothingElse) {
  // 3 runs of 4 floats out of a [3, 7] source starting at column 2, into a [3, 5] destination
  // starting at column 1.
  std::vector<float> source(21), destination(15, -1.0f);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i);
  lattice::host_memory().copy_rows(destination.data() + 1, 5 * sizeof(float), source.data() + 2,
                                   7 * sizeof(float), 4 * sizeof(float), 3,
                                   lattice::CopyKind::device_to_device);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) {
      const float expected = c == 0 ? -1.0f : static_cast<float>(r * 7 + 2 + c - 1);
      EXPECT_EQ(destination[static_cast<size_t>(r * 5 + c)], expected) << r << "," << c;
    }
}
