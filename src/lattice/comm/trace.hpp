// CollectiveTrace: a rank's ring buffer of its most recent collectives (sequence number, op, group,
// bytes, algorithm, state, times), readable from other threads for hang and mismatch reports.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lattice/comm/algorithm.hpp"
#include "lattice/comm/collective.hpp"

namespace lattice::comm {

enum class RecordState : uint8_t { entered, completed, failed };

// One collective as one rank saw it. Plain data so it can live in shared memory.
struct CollectiveRecord {
  uint64_t seq = 0;  // 1-based position in the communicator's collective order
  CollectiveDescriptor descriptor;
  Algorithm algorithm = Algorithm::automatic;
  RecordState state = RecordState::entered;
  int32_t group_size = 0;
  int64_t bytes = 0;       // bytes this rank contributes
  int64_t entered_ns = 0;  // record-clock times (record_clock.hpp)
  int64_t finished_ns = 0;
};

// e.g. "#12 allreduce(f32 x 1024, sum) [ring, 4 ranks, 4096 B] entered".
std::string describe_record(const CollectiveRecord& record);

class PublishedRecord;

// Written by one thread at a time without a lock (every collective records twice): the rank's
// thread, or its asynchronous executor, which a blocking collective drains first. Read from any
// thread; a reader racing the writer may see a slot already reused for a newer record.
class CollectiveTrace {
 public:
  explicit CollectiveTrace(size_t capacity = 64);
  ~CollectiveTrace();
  // Appends a record, or updates the newest one when it has the same sequence number.
  void record(const CollectiveRecord& record);
  // Up to `capacity` records, oldest first.
  std::vector<CollectiveRecord> recent() const;
  std::optional<CollectiveRecord> last() const;
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::unique_ptr<PublishedRecord[]> ring_;
  std::atomic<uint64_t> written_{0};
  uint64_t newest_seq_ = 0;  // the writer's own copy of the newest record's sequence number
  size_t newest_slot_ = 0;   // the writer's: where the newest record is (no division per record)
};

}  // namespace lattice::comm
