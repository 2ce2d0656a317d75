// Tests of the quorum record's data bookkeeping (parallel/replica/quorum_record.hpp): the start
// hands out one block per member; contributors bring theirs back; a group that leaves gives its
// block back to the pending list, handed out first; and over a long random history of deaths
// and joins every block handed out is brought back exactly once or is still out or pending —
// checked by an independent tally of who holds what, not by the record's own lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "lattice/core/error.hpp"
#include "lattice/parallel/replica/quorum_record.hpp"

using namespace lattice;
using replica::next_record;
using replica::QuorumRecord;

TEST(QuorumRecord, TheStartHandsOutABlockPerMemberFromTheFirstUnread) {
  const QuorumRecord r = next_record(std::nullopt, 0, 0, {2, 0, 1}, {});
  EXPECT_EQ(r.members, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(r.contributors.empty());
  EXPECT_EQ(r.source, 0);
  EXPECT_EQ(r.blocks, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(r.next_block, 3);
  EXPECT_TRUE(r.pending.empty());
  EXPECT_EQ(r.block_of(2), 2);
  EXPECT_THROW(r.block_of(3), Error);
  // A start from a checkpoint: blocks from the first one the checkpoint has not read.
  QuorumRecord before;
  before.next_block = 7;
  EXPECT_EQ(next_record(before, 3, 0, {0, 1}, {}).blocks, (std::vector<int64_t>{7, 8}));
}

TEST(QuorumRecord, ALeavingGroupsBlockIsHandedOutAgainFirst) {
  const QuorumRecord start = next_record(std::nullopt, 0, 0, {0, 1, 2}, {});
  // Group 1 died during round 1: 0 and 2 bring back blocks 0 and 2; block 1 is pending and
  // goes to the first member.
  const QuorumRecord one = next_record(start, 1, 0, {0, 2}, {0, 2});
  EXPECT_EQ(one.contributors, (std::vector<int>{0, 2}));
  EXPECT_EQ(one.completed, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(one.blocks, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(one.pending.empty());
  EXPECT_EQ(one.source, 0);
  // Group 1 comes back (a joiner: it brings nothing) and takes a new block.
  const QuorumRecord two = next_record(one, 2, 0, {0, 1, 2}, {0, 2});
  EXPECT_EQ(two.completed, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(two.blocks, (std::vector<int64_t>{4, 5, 6}));
  // A contributor that is not a member of the previous record brings nothing back.
  const QuorumRecord three = next_record(two, 3, 0, {0, 1, 2, 3}, {0, 1, 2, 3});
  EXPECT_EQ(three.contributors, (std::vector<int>{0, 1, 2}));
  // Everyone but 2 left: 2 brings its block back; the others' are pending, the lowest handed to 2.
  const QuorumRecord four = next_record(three, 4, 0, {2}, {2});
  // (three handed out 7, 8, 9, 10 to groups 0 .. 3.)
  EXPECT_EQ(four.completed, (std::vector<int64_t>{9}));
  EXPECT_EQ(four.blocks, (std::vector<int64_t>{7}));
  EXPECT_EQ(four.pending, (std::vector<int64_t>{8, 10}));
  EXPECT_EQ(four.source, 2);
}

TEST(QuorumRecord, RoundTripsThroughJsonAndRefusesDamage) {
  const QuorumRecord start = next_record(std::nullopt, 0, 0, {0, 1, 2}, {});
  const QuorumRecord r = next_record(start, 1, 2, {0, 2}, {2});
  EXPECT_EQ(QuorumRecord::from_json(r.to_json(), "x"), r);
  try {
    QuorumRecord::from_json("{\"round\": 1}", "the store's key k");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the store's key k is not a replica quorum record"),
              std::string::npos)
        << e.what();
  }
}

// A random history of 400 outer steps over 5 group ids: at each, some groups die (their block is
// lost with them), some join, the rest bring back what they trained. Tallied independently: every
// block handed out is trained to the end exactly once (completed once), or is held by a member
// now, or is pending; none is completed twice and no number below next_block is missing.
TEST(QuorumRecord, NoBlockIsLostOrTrainedTwiceAcrossDeathsAndJoins) {
  std::mt19937 random(45);
  std::optional<QuorumRecord> previous;
  std::set<int> alive = {0, 1, 2};
  std::map<int64_t, int> completed;  // block -> times brought back
  for (int64_t round = 0; round < 400; ++round) {
    std::vector<int> members, contributors;
    for (int g = 0; g < 5; ++g) {
      const bool was = alive.count(g) > 0;
      const bool dies = was && random() % 7 == 0, joins = !was && random() % 3 == 0;
      if (was && !dies) {
        members.push_back(g);
        contributors.push_back(g);  // it trained its block (a member of the last record)
      } else if (joins) {
        members.push_back(g);  // comes with nothing to bring
      }
    }
    if (members.empty()) members.push_back(0);
    const QuorumRecord r = next_record(previous, round, 0, members, contributors);
    for (int64_t b : r.completed) ++completed[b];
    alive = std::set<int>(r.members.begin(), r.members.end());
    previous = r;
  }
  const QuorumRecord& last = *previous;
  std::map<int64_t, int> seen = completed;
  for (int64_t b : last.blocks) ++seen[b];
  for (int64_t b : last.pending) ++seen[b];
  ASSERT_GT(last.next_block, 400);
  for (int64_t b = 0; b < last.next_block; ++b) EXPECT_EQ(seen[b], 1) << "block " << b;
  EXPECT_EQ(static_cast<int64_t>(seen.size()), last.next_block);
  for (const auto& [block, times] : completed) EXPECT_EQ(times, 1) << "block " << block;
}
