// PublishedRecord (the lock-free record behind the trace ring and the status boards): a reader
// racing the writer never sees a half-written record, and the trace keeps its ring order.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "lattice/comm/published_record.hpp"

namespace lattice::comm {
namespace {

// Every field derived from one counter: a torn read shows up as fields that disagree.
CollectiveRecord record_for(uint64_t i) {
  CollectiveRecord r;
  r.seq = i;
  r.descriptor.count = static_cast<int64_t>(i);
  r.descriptor.root = static_cast<int32_t>(i % 1000);
  r.group_size = static_cast<int32_t>(i % 977);
  r.bytes = static_cast<int64_t>(3 * i);
  r.entered_ns = static_cast<int64_t>(5 * i);
  r.finished_ns = static_cast<int64_t>(7 * i);
  return r;
}

TEST(PublishedRecord, ReadersRacingTheWriterSeeWholeRecords) {
  PublishedRecord published;
  EXPECT_FALSE(published.load().has_value());  // nothing stored yet
  // The writer keeps going until the reader has seen enough records: on a loaded 2-core CI
  // machine the reader may not be scheduled at all during a fixed number of stores.
  constexpr uint64_t kMinimumStores = 300000, kMinimumReads = 1000;
  std::atomic<uint64_t> reads{0};
  std::atomic<bool> done{false};
  uint64_t last_stored = 0;
  std::thread writer([&] {
    uint64_t i = 1;
    for (;; ++i) {
      published.store(record_for(i));
      if (i >= kMinimumStores && reads.load(std::memory_order_relaxed) >= kMinimumReads) break;
    }
    last_stored = i;
    done.store(true);
  });
  uint64_t last_seq = 0;
  bool consistent = true, monotonic = true;
  while (!done.load()) {
    auto r = published.load();
    if (!r) continue;
    reads.fetch_add(1, std::memory_order_relaxed);
    const CollectiveRecord expected = record_for(r->seq);
    consistent = consistent && r->descriptor.count == expected.descriptor.count &&
                 r->descriptor.root == expected.descriptor.root &&
                 r->group_size == expected.group_size && r->bytes == expected.bytes &&
                 r->entered_ns == expected.entered_ns && r->finished_ns == expected.finished_ns;
    monotonic = monotonic && r->seq >= last_seq;
    last_seq = r->seq;
  }
  writer.join();
  EXPECT_GE(reads.load(), kMinimumReads);
  EXPECT_TRUE(consistent);
  EXPECT_TRUE(monotonic);
  EXPECT_EQ(published.load()->seq, last_stored);
}

TEST(CollectiveTrace, KeepsTheNewestRecordsOldestFirstAndUpdatesTheNewestInPlace) {
  CollectiveTrace trace(4);
  EXPECT_FALSE(trace.last().has_value());
  for (uint64_t i = 1; i <= 6; ++i) trace.record(record_for(i));
  CollectiveRecord completed = record_for(6);
  completed.state = RecordState::completed;
  trace.record(completed);  // same sequence number: replaces the entered record
  const auto recent = trace.recent();
  ASSERT_EQ(recent.size(), 4u);
  for (size_t i = 0; i < recent.size(); ++i) EXPECT_EQ(recent[i].seq, 3 + i);
  EXPECT_EQ(recent.back().state, RecordState::completed);
  EXPECT_EQ(trace.last()->seq, 6u);
}

}  // namespace
}  // namespace lattice::comm
