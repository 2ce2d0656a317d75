// Pipeline stage partitions (issue #22 item 3): even splits with the remainder in the middle
// stages (126 layers on 16 stages as Llama 3 405B was trained: 7 on the first and last, 8
// elsewhere), user-listed splits with one error line for a wrong one, and the cost-balanced split
// against an exhaustive search over every contiguous split of small models.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/stage_partition.hpp"

using namespace lattice;
using namespace lattice::pipeline;

namespace {

std::vector<int64_t> counts(const StagePartition& p) {
  std::vector<int64_t> c;
  for (int s = 0; s < p.stages(); ++s) c.push_back(p.layers(s));
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double most_expensive(const std::vector<int64_t>& c, double block, double embedding, double head) {
  double worst = 0;
  for (size_t s = 0; s < c.size(); ++s)
    worst = std::max(worst, static_cast<double>(c[s]) * block + (s == 0 ? embedding : 0) +
                                (s + 1 == c.size() ? head : 0));
  return worst;
}

// The least possible most-expensive stage over every split of n blocks into `stages` parts.
double exhaustive_best(int64_t n, int stages, double block, double embedding, double head) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> c(static_cast<size_t>(stages), 1);
  std::function<void(int, int64_t)> place = [&](int s, int64_t left) {
    if (s == stages - 1) {
      c[static_cast<size_t>(s)] = left;
      best = std::min(best, most_expensive(c, block, embedding, head));
      return;
    }
    for (int64_t k = 1; k <= left - (stages - 1 - s); ++k) {
      c[static_cast<size_t>(s)] = k;
      place(s + 1, left - k);
    }
  };
  place(0, n);
  return best;
}

}  // namespace

TEST(StagePartition, EvenSplitsPutTheRemainderInTheMiddle) {
  EXPECT_EQ(counts(even_partition(8, 4)), (std::vector<int64_t>{2, 2, 2, 2}));
  const std::vector<int64_t> llama405b = counts(even_partition(126, 16));
  ASSERT_EQ(llama405b.size(), 16u);
  EXPECT_EQ(llama405b.front(), 7);
  EXPECT_EQ(llama405b.back(), 7);
  for (size_t s = 1; s + 1 < llama405b.size(); ++s) EXPECT_EQ(llama405b[s], 8) << s;
  EXPECT_EQ(counts(even_partition(10, 4)), (std::vector<int64_t>{2, 3, 3, 2}));
  const StagePartition p = even_partition(126, 16);
  EXPECT_EQ(p.first.front(), 0);
  EXPECT_EQ(p.first.back(), 126);
  EXPECT_NE(error_of([] { even_partition(3, 4); }).find("at least one block each"),
            std::string::npos);
}

TEST(StagePartition, ListedSplitsMustCoverTheLayers) {
  EXPECT_EQ(counts(listed_partition({3, 5}, 8)), (std::vector<int64_t>{3, 5}));
  EXPECT_NE(error_of([] {
              listed_partition({3, 4}, 8);
            }).find("sums to 7 blocks"),
            std::string::npos);
  EXPECT_NE(error_of([] { listed_partition({8, 0}, 8); }).find("at least one"), std::string::npos);
  EXPECT_NE(error_of([] { listed_partition({}, 8); }).find("empty"), std::string::npos);
}

TEST(StagePartition, BalancedSplitsMinimiseTheMostExpensiveStage) {
  // Without embedding and head costs the balance is the even split's maximum.
  EXPECT_EQ(most_expensive(counts(balanced_partition(126, 16, 1, 0, 0)), 1, 0, 0), 8);
  // A head as costly as 3 blocks (a large vocabulary) leaves the last stage fewer blocks.
  const std::vector<int64_t> heavy = counts(balanced_partition(12, 4, 1, 0, 3));
  EXPECT_EQ(heavy.back(), 1);
  for (int64_t n = 2; n <= 11; ++n)
    for (int stages = 1; stages <= std::min<int64_t>(4, n); ++stages)
      for (const auto& [embedding, head] :
           std::vector<std::pair<double, double>>{{0, 0}, {0.5, 1.5}, {2, 0}, {0, 4.25}}) {
        SCOPED_TRACE(std::to_string(n) + " blocks, " + std::to_string(stages) + " stages");
        const StagePartition p = balanced_partition(n, stages, 1, embedding, head);
        ASSERT_EQ(p.stages(), stages);
        EXPECT_EQ(p.first.back(), n);
        for (int s = 0; s < stages; ++s) EXPECT_GE(p.layers(s), 1);
        EXPECT_DOUBLE_EQ(most_expensive(counts(p), 1, embedding, head),
                         exhaustive_best(n, stages, 1, embedding, head));
      }
}
