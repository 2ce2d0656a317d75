// CollectiveTrace: fixed-capacity ring buffer of lock-free published records (one writer).
#include "lattice/comm/trace.hpp"

#include "lattice/comm/published_record.hpp"

#include "lattice/core/error.hpp"

namespace lattice::comm {

std::string describe_record(const CollectiveRecord& record) {
  std::string text("#");
  text.append(std::to_string(record.seq))
      .append(" ")
      .append(record.descriptor.describe())
      .append(" [")
      .append(algorithm_name(record.algorithm))
      .append(", ")
      .append(std::to_string(record.group_size))
      .append(" ranks, ")
      .append(std::to_string(record.bytes))
      .append(" B] ");
  switch (record.state) {
    case RecordState::entered:
      text += "entered";
      break;
    case RecordState::completed:
      text += "completed";
      break;
    case RecordState::failed:
      text += "failed";
      break;
  }
  return text;
}

CollectiveTrace::CollectiveTrace(size_t capacity)
    : capacity_(capacity == 0 ? 1 : capacity), ring_(new PublishedRecord[capacity_]) {}

CollectiveTrace::~CollectiveTrace() = default;

void CollectiveTrace::record(const CollectiveRecord& record) {
  const uint64_t written = written_.load(std::memory_order_relaxed);
  if (written > 0 && newest_seq_ == record.seq) {
    ring_[newest_slot_].store(record);
    return;
  }
  const size_t slot = written == 0 ? 0 : (newest_slot_ + 1 == capacity_ ? 0 : newest_slot_ + 1);
  ring_[slot].store(record);
  newest_slot_ = slot;
  newest_seq_ = record.seq;
  written_.store(written + 1, std::memory_order_release);
}

std::vector<CollectiveRecord> CollectiveTrace::recent() const {
  const uint64_t written = written_.load(std::memory_order_acquire);
  std::vector<CollectiveRecord> out;
  const uint64_t first = written > capacity_ ? written - capacity_ : 0;
  for (uint64_t i = first; i < written; ++i) {
    if (auto record = ring_[i % capacity_].load()) out.push_back(*record);
  }
  return out;
}

std::optional<CollectiveRecord> CollectiveTrace::last() const {
  const uint64_t written = written_.load(std::memory_order_acquire);
  if (written == 0) return std::nullopt;
  return ring_[(written - 1) % capacity_].load();
}

}  // namespace lattice::comm
