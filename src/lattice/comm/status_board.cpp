// FailureFlag and the in-process StatusBoard.
#include "lattice/comm/status_board.hpp"

namespace lattice::comm {

void FailureFlag::set(int rank, const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (set_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  rank_ = rank;
  set_.store(true, std::memory_order_release);
}

std::string FailureFlag::reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

int FailureFlag::rank() const {
  std::lock_guard lock(mutex_);
  return rank_;
}

InProcessStatusBoard::InProcessStatusBoard(int size, std::shared_ptr<FailureFlag> failure_flag)
    : failure_flag_(std::move(failure_flag)) {
  for (int r = 0; r < size; ++r) traces_.push_back(std::make_unique<CollectiveTrace>());
}

void InProcessStatusBoard::publish(int rank, const CollectiveRecord& record) {
  traces_[static_cast<size_t>(rank)]->record(record);
}

std::optional<CollectiveRecord> InProcessStatusBoard::last(int rank) const {
  return traces_[static_cast<size_t>(rank)]->last();
}

CollectiveTrace* InProcessStatusBoard::rank_trace(int rank) {
  return traces_[static_cast<size_t>(rank)].get();
}

std::string InProcessStatusBoard::failure() const {
  if (!failure_flag_ || !failure_flag_->is_set()) return {};
  return "rank " + std::to_string(failure_flag_->rank()) + " failed: " + failure_flag_->reason();
}

}  // namespace lattice::comm
