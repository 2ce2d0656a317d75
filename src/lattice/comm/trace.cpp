// CollectiveTrace: fixed-capacity ring buffer guarded by a mutex (uncontended except during
// reports).
#include "lattice/comm/trace.hpp"

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

CollectiveTrace::CollectiveTrace(size_t capacity) : ring_(capacity == 0 ? 1 : capacity) {}

void CollectiveTrace::record(const CollectiveRecord& record) {
  std::lock_guard lock(mutex_);
  if (written_ > 0) {
    CollectiveRecord& newest = ring_[(written_ - 1) % ring_.size()];
    if (newest.seq == record.seq) {
      newest = record;
      return;
    }
  }
  ring_[written_ % ring_.size()] = record;
  ++written_;
}

std::vector<CollectiveRecord> CollectiveTrace::recent() const {
  std::lock_guard lock(mutex_);
  std::vector<CollectiveRecord> out;
  uint64_t first = written_ > ring_.size() ? written_ - ring_.size() : 0;
  for (uint64_t i = first; i < written_; ++i) out.push_back(ring_[i % ring_.size()]);
  return out;
}

std::optional<CollectiveRecord> CollectiveTrace::last() const {
  std::lock_guard lock(mutex_);
  if (written_ == 0) return std::nullopt;
  return ring_[(written_ - 1) % ring_.size()];
}

}  // namespace lattice::comm
