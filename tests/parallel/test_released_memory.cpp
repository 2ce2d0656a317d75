// release_floats: the range reads back as zeros, the neighbours are untouched, and the whole pages
// inside it leave the resident set (what makes ZeRO-2/3's memory drop real, not only tracked).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/parallel/released_memory.hpp"

TEST(ReleasedMemory, RangeBecomesZeroAndNeighboursStay) {
  std::vector<float> data(100000, 1.5f);
  lattice::parallel::release_floats(data.data() + 777, 50000);
  for (size_t i = 0; i < data.size(); ++i) {
    const bool inside = i >= 777 && i < 777 + 50000;
    ASSERT_EQ(data[i], inside ? 0.0f : 1.5f) << i;
  }
  lattice::parallel::release_floats(data.data() + 3, 5);  // less than a page
  EXPECT_EQ(data[2], 1.5f);
  EXPECT_EQ(data[3], 0.0f);
  EXPECT_EQ(data[7], 0.0f);
  EXPECT_EQ(data[8], 1.5f);
}

TEST(ReleasedMemory, ResidentSetDrops) {
  const size_t count = size_t{64} << 20 >> 2;  // 64 MiB of floats
  auto* data = static_cast<float*>(std::aligned_alloc(64, count * sizeof(float)));
  ASSERT_NE(data, nullptr);
  for (size_t i = 0; i < count; ++i) data[i] = 1.0f;  // commit every page
  const int64_t before = lattice::process_rss_bytes();
  if (before == 0) GTEST_SKIP() << "no /proc RSS on this system";
  lattice::parallel::release_floats(data, static_cast<int64_t>(count));
  const int64_t after = lattice::process_rss_bytes();
  EXPECT_LT(after, before - (int64_t{48} << 20)) << before << " -> " << after;
  EXPECT_EQ(data[count / 2], 0.0f);
  std::free(data);
}
